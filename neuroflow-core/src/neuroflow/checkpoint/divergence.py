"""Which training checkpoints are good: the rule that keeps a diverging run's last sane state.

The rule. A checkpoint holds the weights after its step; what they are
worth shows in the losses of the steps taken from them, up to the next
checkpoint: its *window*. A checkpoint is **good** when every step loss of
its window is finite and the window's mean is at most
``max(first, EXPLOSION_FACTOR × best)``, where ``first`` is the loss of the
run's first step and ``best`` the lowest window mean so far (``first``
before there is one). Otherwise it is **bad**: training from it made the
loss explode, above where the run started and ten times above the best it
had reached. Losses that wander near their best, or stay below the first
loss, are not divergence: a run that converges is never marked bad,
however noisy its steps.

So a checkpoint is judged when the next one is written (the newest one is
*pending*), and a NaN or infinite loss makes the pending one bad at once.
Each checkpoint's metadata records the verdict on its window's start (the
checkpoint before it, ``judges``) and the newest checkpoint known good
(``newest_good``); the newest good one is never pruned, whatever
``keep_checkpoints`` says, and a ``NonFiniteLossError`` names it as the one
to resume from. A state whose weights are NaN or Inf is never written.
The rule assumes a loss that is not negative (every NeuroFlow loss).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: How far above the best window mean a window's mean may go (when it is also above the first loss).
EXPLOSION_FACTOR = 10.0


@dataclass(frozen=True)
class Verdict:
    """The verdict on one window: good or not, its mean loss and step count, why (one line), and the step of
    the checkpoint it judges (the one the window started from; None for the run's first window)."""

    good: bool
    mean: float | None
    steps: int
    reason: str
    judges: int | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class LossWatch:
    """The step losses since the last checkpoint, the run's references, and which checkpoints are good.

    :meth:`observe` takes each step's loss; :meth:`judge` gives the verdict
    on the window a checkpoint written now closes, and the watch's state once
    it is written, which :meth:`commit` then adopts (a write that fails
    changes nothing). ``pending`` is the step of the newest checkpoint (not
    judged yet), ``newest_good`` the step of the newest one judged good.
    """

    def __init__(self) -> None:
        self.first: float | None = None
        self.best: float | None = None
        self.pending: int | None = None
        self.newest_good: int | None = None
        self.last: Verdict | None = None
        self._sum = 0.0
        self._steps = 0
        self._finite = True

    def observe(self, loss: float) -> None:
        """Count one optimisation step's mean loss."""
        loss = float(loss)
        if not math.isfinite(loss):
            self._finite = False
        elif self.first is None:
            self.first = loss
        self._sum += loss
        self._steps += 1

    def judge(self, step: int) -> tuple[Verdict | None, dict[str, Any]]:
        """The verdict on the window a checkpoint at ``step`` closes (None when no step was taken since the
        last checkpoint: it is written again at the same step), and the state to keep once it is written."""
        if self._steps == 0:
            return self.last, self.state_dict()
        mean = self._sum / self._steps
        best, judged = self.best, self.pending
        if not self._finite or not math.isfinite(mean):
            verdict = Verdict(False, None, self._steps, "a loss since the previous checkpoint is not finite", judged)
        else:
            first = self.first if self.first is not None else mean
            reference = best if best is not None else first
            limit = max(first, EXPLOSION_FACTOR * reference)
            if mean <= limit:
                verdict = Verdict(True, mean, self._steps, f"mean loss {mean:.6g} <= {limit:.6g}", judged)
            else:
                verdict = Verdict(False, mean, self._steps,
                                  f"mean loss {mean:.6g} exploded: above the first loss {first:.6g} and "
                                  f"{EXPLOSION_FACTOR:g}x the best window mean {reference:.6g}", judged)
            best = mean if best is None else min(best, mean)
        newest_good = judged if verdict.good and judged is not None else self.newest_good
        return verdict, {"first": self.first, "best": best, "pending": step, "newest_good": newest_good,
                         "last": verdict.as_json()}

    def commit(self, state: dict[str, Any]) -> None:
        """Adopt the state :meth:`judge` returned: the checkpoint was written and its window closes."""
        self.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the watch (its window is empty then)."""
        return {"first": self.first, "best": self.best, "pending": self.pending, "newest_good": self.newest_good,
                "last": None if self.last is None else self.last.as_json()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a resumed run judges as the uninterrupted one would)."""
        self.first = _number(state.get("first"))
        self.best = _number(state.get("best"))
        self.pending = _step(state.get("pending"))
        self.newest_good = _step(state.get("newest_good"))
        self.last = verdict_from(state.get("last"))
        self._sum, self._steps, self._finite = 0.0, 0, True


def verdict_from(value: Any) -> Verdict | None:
    """A :class:`Verdict` from its JSON, or None when ``value`` is not one."""
    if not (isinstance(value, dict) and isinstance(value.get("good"), bool)):
        return None
    return Verdict(value["good"], _number(value.get("mean")), _step(value.get("steps")) or 0,
                   str(value.get("reason", "")), _step(value.get("judges")))


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
