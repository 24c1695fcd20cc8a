"""Progress reporting for training: a tqdm bar per epoch when tqdm is installed, else one line per epoch."""

from __future__ import annotations

import sys
from typing import Any, TextIO


class EpochProgress:
    """Shows progress through one epoch's steps and prints the epoch's metrics at its end."""

    def __init__(self, epoch: int, epochs: int, steps: int, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.epoch, self.epochs, self.steps = epoch, epochs, steps
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=steps, desc=f"epoch {epoch}/{epochs}", unit="step",
                                 file=self.stream, leave=True, dynamic_ncols=True, mininterval=0.25)

    def update(self, loss: float) -> None:
        bar = self._bar
        if bar is not None:
            bar.update(1)
            if bar.n % 20 == 0 or bar.n == self.steps:
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def print_epoch_metrics(epoch: int, epochs: int, metrics: dict[str, float], stream: TextIO | None = None) -> None:
    """One line with the epoch's metrics: ``epoch 2/5  loss=0.1234  accuracy=0.9712 ...``."""
    shown = {k: v for k, v in metrics.items() if k != "epoch"}
    text = "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
    print(f"epoch {epoch}/{epochs}  {text}", file=stream or sys.stdout, flush=True)
