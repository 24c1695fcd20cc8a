"""The thread that trains a Trainer: one at a time; a call to train from a second thread is refused.

Inference takes turns instead: :meth:`MemorySession.lend` runs one call
on the model at a time (a step, a ``predict``, an ``evaluate``), and the
others wait for it. Two threads that both train one trainer would
interleave their steps into one run, so the second is refused.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from neuroflow.errors import TrainerInUseError

Method = TypeVar("Method", bound=Callable[..., Any])


class TrainingThread:
    """Which thread is training now (``owner``, in ``call``), or None.

    The calls that train nest within that thread (``fit`` saves checkpoints
    and evaluates, a hook may call ``train_step``); from any other thread
    they raise :class:`TrainerInUseError` until the outermost one returns.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: threading.Thread | None = None
        self.call = ""
        self._depth = 0

    def enter(self, call: str) -> None:
        """Start training in this thread (``call`` names what), or raise if another thread is training."""
        me = threading.current_thread()
        with self._lock:
            owner = self.owner
            if owner is not None and owner is not me:
                raise TrainerInUseError(
                    f"{call} was called from thread {me.name!r} while thread {owner.name!r} is training this trainer "
                    f"(in {self.call}); one thread trains a trainer at a time. Call {call} from that thread or "
                    f"after its {self.call} has returned; to train two models at once, give each thread its own "
                    f"Trainer and model (predict and evaluate may be called from any thread: they take turns)."
                )
            if owner is None:
                self.owner, self.call = me, call
            self._depth += 1

    def leave(self) -> None:
        """End what the matching :meth:`enter` started; the outermost one frees the trainer for any thread."""
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self.owner, self.call = None, ""


def trains(method: Method) -> Method:
    """Mark a Trainer method that changes the training state: it runs only in the thread that trains (see
    :class:`TrainingThread`; the trainer holds one as ``training_thread``)."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        training = self.training_thread
        training.enter(name)
        try:
            return method(self, *args, **kwargs)
        finally:
            training.leave()

    return cast(Method, guarded)
