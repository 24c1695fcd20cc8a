"""Step: multiply the learning rate by ``gamma`` every ``step_size`` epochs (or steps)."""

from __future__ import annotations

from typing import Any

from neuroflow.errors import ConfigError
from neuroflow.schedulers.base import Scheduler, check_count, check_number


class Step(Scheduler):
    """Decays the learning rate by ``gamma`` every ``step_size`` epochs, or every ``step_size_steps`` steps.

    ``lr(step) = base_lr * gamma ** (step // interval)``. Give exactly one of
    ``step_size`` (epochs, converted with the run's steps per epoch) and
    ``step_size_steps`` (optimisation steps).

    Example::

        scheduler = nf.schedulers.Step(step_size=30, gamma=0.1)
    """

    def __init__(self, step_size: int | None = None, gamma: float = 0.1, step_size_steps: int | None = None) -> None:
        super().__init__()
        if (step_size is None) == (step_size_steps is None):
            raise ConfigError(
                f"Step: give exactly one of step_size (epochs) and step_size_steps; "
                f"got step_size={step_size!r}, step_size_steps={step_size_steps!r}"
            )
        self.step_size = None if step_size is None else check_count("Step", "step_size", step_size, 1)
        self.step_size_steps = (
            None if step_size_steps is None else check_count("Step", "step_size_steps", step_size_steps, 1)
        )
        self.gamma = check_number("Step", "gamma", gamma, 0.0, above=True)

    def get_config(self) -> dict[str, Any]:
        return {"step_size": self.step_size, "gamma": self.gamma, "step_size_steps": self.step_size_steps}

    @property
    def interval(self) -> int:
        """Optimisation steps between two decays (needs :meth:`bind` when given in epochs)."""
        if self.step_size_steps is not None:
            return self.step_size_steps
        return int(self.step_size or 0) * self.steps_per_epoch

    def _lr(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.interval)
