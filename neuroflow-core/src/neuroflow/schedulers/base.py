"""The Scheduler interface: the learning rate for each optimisation step of a bound training run."""

from __future__ import annotations

import math
import numbers
from typing import Any

from neuroflow.errors import ConfigError


def check_count(owner: str, name: str, value: Any, minimum: int = 0) -> int:
    """Return ``value`` as an int, or raise ConfigError unless it is a whole number >= ``minimum``."""
    whole = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not whole or value != int(value) or value < minimum:
        raise ConfigError(f"{owner}: {name} must be a whole number >= {minimum}; got {value!r}")
    return int(value)


def check_number(owner: str, name: str, value: Any, minimum: float = 0.0, *, above: bool = False) -> float:
    """Return ``value`` as a float, or raise ConfigError unless it is a finite number >= ``minimum`` (> with
    ``above``): an int or a float, never a bool or a string."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not (value > minimum if above else value >= minimum):
        raise ConfigError(f"{owner}: {name} must be a finite number {'>' if above else '>='} {minimum:g}; "
                          f"got {value!r} ({type(value).__name__})")
    return float(value)


class Scheduler:
    """Maps the optimisation step index (0-based) to a learning rate.

    Created from its configuration alone; the Trainer calls :meth:`bind` with
    the optimizer's base learning rate and the run's length before training,
    then :meth:`lr` once per optimisation step. Subclasses implement
    :meth:`_lr`, validate run-dependent arguments in :meth:`_check_binding`,
    and return their constructor arguments from :meth:`get_config`.
    """

    def __init__(self) -> None:
        self.base_lr = 0.0
        self.steps_per_epoch = 0
        self.total_steps = 0
        self._bound = False

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this scheduler (saved in checkpoints)."""
        return {}

    def bind(self, base_lr: float, steps_per_epoch: int, total_steps: int) -> None:
        """Fix the run this scheduler serves: base learning rate, steps per epoch, total optimisation steps."""
        name = type(self).__name__
        base_lr = float(base_lr)
        if not (math.isfinite(base_lr) and base_lr > 0.0):
            raise ConfigError(f"{name}.bind: base_lr must be a finite number > 0; got {base_lr!r}")
        steps_per_epoch = check_count(f"{name}.bind", "steps_per_epoch", steps_per_epoch, 1)
        total_steps = check_count(f"{name}.bind", "total_steps", total_steps, 1)
        self._check_binding(base_lr, steps_per_epoch, total_steps)
        self.base_lr, self.steps_per_epoch, self.total_steps = base_lr, steps_per_epoch, total_steps
        self._bound = True

    def _check_binding(self, base_lr: float, steps_per_epoch: int, total_steps: int) -> None:
        """Raise ConfigError when this configuration cannot serve the run; called by :meth:`bind`."""

    def lr(self, step: int) -> float:
        """The learning rate for optimisation step ``step`` (0-based)."""
        if not self._bound:
            raise RuntimeError(
                f"{type(self).__name__} is not bound to a run; call bind(base_lr, steps_per_epoch, total_steps) first"
            )
        if step < 0:
            raise ValueError(f"{type(self).__name__}.lr: step must be >= 0; got {step!r}")
        return self._lr(int(step))

    def _lr(self, step: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} does not implement _lr")

    def state_dict(self) -> dict[str, Any]:
        """Type and configuration, for a checkpoint (the values follow from the step count)."""
        return {"type": type(self).__name__, "config": self.get_config()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the configuration :meth:`state_dict` returned; a bound scheduler stays bound to its run."""
        kind = state_dict.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict is for scheduler {kind!r}; this scheduler is {type(self).__name__}")
        restored = type(self)(**state_dict["config"])  # validates the saved configuration
        if self._bound:
            restored.bind(self.base_lr, self.steps_per_epoch, self.total_steps)
        self.__dict__.update(restored.__dict__)

    def __repr__(self) -> str:
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"
