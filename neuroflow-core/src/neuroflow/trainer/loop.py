"""The epoch loop: micro-batches gathered into steps, the progress bar, step checkpoints, and Ctrl-C."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from neuroflow.progress import EpochProgress
from neuroflow.trainer.step import OptimisationStep


class Interruption:
    """A stop asked for by Ctrl-C (or :meth:`request`): the loop ends after the current step; a second Ctrl-C
    aborts at once. The handler is installed only in the main thread, where Python delivers signals."""

    def __init__(self) -> None:
        self.requested = False
        #: in a data-parallel run: whether the ranks agreed, at the end of the last step, that one of them asked
        #: to stop (what the loop acts on, so that every rank stops after the same step)
        self.agreed = False
        self._previous: Any = None

    def request(self) -> None:
        self.requested = True

    def __enter__(self) -> Interruption:
        self.requested = self.agreed = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


@dataclass
class EpochTotals:
    """The running sums of an epoch in progress: what its History row is computed from.

    A step checkpoint saves them and resuming restores them, so the row of
    an epoch interrupted and resumed equals the uninterrupted one's.
    """

    epoch: int
    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EpochTotals:
        return cls(int(state["epoch"]), float(state["loss_sum"]), int(state["correct"]), int(state["seen"]))


class EpochRunner:
    """Runs one epoch of ``loader`` through ``step``: ``accumulation`` batches a step, the last one short if the
    data ends early; ``after_step()`` runs after every step (the trainer's step checkpoints).

    ``complete`` says whether the last :meth:`run` went through all the data
    (not stopped by an interruption); ``totals`` holds the running sums of
    the epoch while it runs (None between epochs), which step checkpoints save.
    """

    def __init__(self, step: OptimisationStep, interruption: Interruption, augment: Callable[..., Any] | None,
                 after_step: Callable[[Any], None], progress: bool, max_steps: int | None = None) -> None:
        self.step = step
        self.max_steps = max_steps
        self.interruption = interruption
        self.augment = augment
        self.after_step = after_step
        self.progress = progress
        self.complete = False
        self.totals: EpochTotals | None = None

    def run(self, loader: Iterable[Any], epoch: int, epochs: int, steps: int,
            resumed: EpochTotals | None = None) -> dict[str, float]:
        """Train on one epoch of ``loader``; its metrics (loss, accuracy, lr, time).

        ``resumed`` continues an epoch a checkpoint interrupted: its sums are
        those of the batches taken before, and ``loader`` yields the rest
        (nothing when the checkpoint was written after the epoch's last step).
        """
        start = time.perf_counter()
        bar = EpochProgress(epoch, epochs, steps, enabled=self.progress)
        k = self.step.session.accumulation
        totals = self.totals = resumed if resumed is not None else EpochTotals(epoch)
        window: list[tuple[Any, Any]] = []
        batches = iter(loader)
        self.complete = False
        try:
            for x, y in batches:
                if self.reached_max_steps:  # a resumed run that had already taken them
                    break
                window.append(self._augmented(x, y))
                # only the window holds the batch: once a step took it, nothing keeps it while the next one arrives
                # (the input a budget counts is the step's k batches and those the loader holds ahead)
                x = y = None
                if len(window) < k:
                    continue
                self._take(window, loader, bar, totals)
                window = []
                if self.stopping or self.reached_max_steps:
                    break
            else:
                self.complete = not window
            if window and not (self.stopping or self.reached_max_steps):
                self._take(window, loader, bar, totals)
                self.complete = True
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            bar.close()
            self.totals = None
        seen = totals.seen
        metrics: dict[str, float] = {"epoch": epoch, "loss": totals.loss_sum / seen if seen else math.nan}
        if self.step.classification:
            metrics["accuracy"] = totals.correct / max(seen, 1)
        scheduler = self.step.scheduler
        if scheduler is not None:
            metrics["lr"] = float(scheduler.lr(max(self.step.count - 1, 0)))
        metrics["time_s"] = time.perf_counter() - start
        return metrics

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked for (Ctrl-C, ``request_stop``): in a data-parallel run, whether the ranks
        agreed on it at the end of the last step, so that all of them stop after the same one."""
        return self.interruption.requested if self.step.parallel is None else self.interruption.agreed

    def epochs_for(self, epochs: int, steps_per_epoch: int) -> int:
        """The epochs a ``fit(epochs=epochs)`` runs: as many as ``max_steps`` takes, when it is set."""
        return epochs if self.max_steps is None else max(epochs, math.ceil(self.max_steps / steps_per_epoch))

    def steps_for(self, steps: int) -> int:
        """The optimisation steps of a run of ``steps`` steps, ``max_steps`` at most."""
        return steps if self.max_steps is None else min(steps, self.max_steps)

    @property
    def reached_max_steps(self) -> bool:
        """Whether the run has taken its ``max_steps`` optimisation steps (never, without max_steps)."""
        return self.max_steps is not None and self.step.count >= self.max_steps

    def _augmented(self, x: Any, y: Any) -> tuple[Any, Any]:
        """The batch through the augmenter: ``augment(x, y) -> (x, y)`` when it says ``transforms_targets``
        (geometry that moves boxes, say) and the batch has targets, ``augment(x)`` otherwise."""
        if self.augment is None:
            return x, y
        if y is not None and getattr(self.augment, "transforms_targets", False):
            return self.augment(x, y)
        return self.augment(x), y

    def _take(self, window: list[tuple[Any, Any]], loader: Any, bar: EpochProgress, totals: EpochTotals) -> None:
        loss, hits = self.step.run(window)
        n = self.step.last_rows  # the global batch's rows in a data-parallel run, not this rank's
        totals.loss_sum += loss * n
        totals.correct += hits
        totals.seen += n
        bar.update(loss)
        self.after_step(loader)
