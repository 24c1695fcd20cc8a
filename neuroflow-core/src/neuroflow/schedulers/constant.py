"""Constant: the base learning rate at every step."""

from __future__ import annotations

from neuroflow.schedulers.base import Scheduler


class Constant(Scheduler):
    """Keeps the optimizer's base learning rate for the whole run."""

    def _lr(self, step: int) -> float:
        return self.base_lr
