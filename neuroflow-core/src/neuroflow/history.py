"""History: the per-epoch metrics that ``Trainer.fit`` returns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class History:
    """One dict of metrics per epoch; ``history["val_accuracy"]`` gives that metric over epochs.

    ``history[-1]`` is the last epoch's dict; ``interrupted`` tells whether a
    keyboard interrupt ended training early.
    """

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []
        self.interrupted = False
        self.hook_errors: list[Exception] = []  # what plugins' neuroflow_train_end raised (also warned about)

    def append(self, metrics: dict[str, float]) -> None:
        self.epochs.append(metrics)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            if not any(key in e for e in self.epochs):
                known = sorted({k for e in self.epochs for k in e})
                raise KeyError(f"no metric {key!r} in the history; recorded: {', '.join(known) or 'none'}")
            return [e.get(key) for e in self.epochs]
        return self.epochs[key]

    def __len__(self) -> int:
        return len(self.epochs)

    def __iter__(self) -> Iterator[dict[str, float]]:
        return iter(self.epochs)

    def __repr__(self) -> str:
        return f"History({self.epochs!r}{', interrupted=True' if self.interrupted else ''})"
