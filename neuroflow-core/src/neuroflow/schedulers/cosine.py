"""Cosine: linear warmup, then cosine annealing from the base learning rate down to ``min_lr``."""

from __future__ import annotations

import math
from typing import Any

from neuroflow.errors import ConfigError
from neuroflow.schedulers.base import Scheduler, check_count, check_number


class Cosine(Scheduler):
    """Linear warmup to the base learning rate, then a half cosine down to ``min_lr`` at the last step.

    Warmup lasts ``warmup_steps`` optimisation steps when given, else
    ``warmup_epochs`` epochs (rounded to whole steps); during it
    ``lr(step) = base_lr * (step + 1) / warmup``. After it, with ``progress``
    going from 0 at the end of warmup to 1 at ``total_steps``:
    ``lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * progress)) / 2``; steps
    past ``total_steps`` keep ``min_lr``.

    Example::

        scheduler = nf.schedulers.Cosine(warmup_epochs=1, min_lr=1e-5)
    """

    def __init__(self, warmup_epochs: float = 0, warmup_steps: int = 0, min_lr: float = 0.0) -> None:
        super().__init__()
        self.warmup_epochs = check_number("Cosine", "warmup_epochs", warmup_epochs)
        self.warmup_steps = check_count("Cosine", "warmup_steps", warmup_steps, 0)
        self.min_lr = check_number("Cosine", "min_lr", min_lr)

    def get_config(self) -> dict[str, Any]:
        return {"warmup_epochs": self.warmup_epochs, "warmup_steps": self.warmup_steps, "min_lr": self.min_lr}

    def warmup(self, steps_per_epoch: int | None = None) -> int:
        """Warmup length in optimisation steps: ``warmup_steps`` if given, else epochs × steps per epoch."""
        if self.warmup_steps:
            return self.warmup_steps
        return round(self.warmup_epochs * (self.steps_per_epoch if steps_per_epoch is None else steps_per_epoch))

    def _check_binding(self, base_lr: float, steps_per_epoch: int, total_steps: int) -> None:
        warmup = self.warmup(steps_per_epoch)
        if warmup > total_steps:
            source = (f"warmup_steps={self.warmup_steps}" if self.warmup_steps
                      else f"warmup_epochs={self.warmup_epochs:g} × {steps_per_epoch} steps per epoch")
            raise ConfigError(
                f"Cosine: warmup of {warmup} steps ({source}) is longer than training ({total_steps} steps); "
                "shorten the warmup or train for more epochs"
            )
        if self.min_lr > base_lr:
            raise ConfigError(f"Cosine: min_lr={self.min_lr:g} is above the base learning rate {base_lr:g}")

    def _lr(self, step: int) -> float:
        warmup = self.warmup()
        if step < warmup:
            return self.base_lr * (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        return self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
