"""A resumed trainer's configuration against its checkpoint's: what differs, said once, and the trainer's wins.

The rule: a checkpoint restores *state* (weights, optimizer moments and
step count, the step, random generators, data position, History); the
resuming trainer brings the *configuration* (optimizer hyperparameters such
as ``lr`` and ``weight_decay``, the scheduler). Where they differ, one
warning lists each difference, and the trainer's values are used from the
resumed step on.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from neuroflow.checkpoint.errors import CheckpointError


def as_saved(value: Any) -> Any:
    """``value`` as a checkpoint's JSON gives it back (tuples become lists), so the two compare equal."""
    return json.loads(json.dumps(value))


def optimizer_differences(saved: dict[str, Any], optimizer: Any) -> list[str]:
    """``name: trainer value (checkpoint value)`` for each optimizer hyperparameter that differs."""
    theirs = saved.get("hyperparameters")
    theirs = theirs if isinstance(theirs, dict) else {}
    mine = as_saved(optimizer.get_config())
    name = type(optimizer).__name__
    return [f"{name} {key} {mine.get(key)!r} (checkpoint: {theirs.get(key)!r})"
            for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def scheduler_differences(saved: dict[str, Any] | None, scheduler: Any) -> list[str]:
    """One line when the trainer's scheduler (type or configuration) is not the checkpoint's, else none."""
    theirs = None if saved is None else saved.get("state")
    mine = None if scheduler is None else as_saved(scheduler.state_dict())
    if theirs == mine:
        return []
    return [f"scheduler {_scheduler(mine)} (checkpoint: {_scheduler(theirs)})"]


def _scheduler(state: Any) -> str:
    if not isinstance(state, dict):
        return "none, a constant lr"
    config = state.get("config")
    config = config if isinstance(config, dict) else {}
    arguments = ", ".join(f"{key}={value!r}" for key, value in config.items())
    return f"{state.get('type')}({arguments})"


def warn_differences(path: Path, step: int, differences: list[str]) -> None:
    """The warning a resumed trainer gives when its configuration is not the checkpoint's."""
    if not differences:
        return
    warnings.warn(
        f"resuming {path.name}: this trainer's configuration differs from the checkpoint's: "
        f"{'; '.join(differences)}. The trainer's values are used from step {step} on; the checkpoint's state "
        "(weights, optimizer moments and step count, random generators, data position, History) is restored "
        "as saved", RuntimeWarning, stacklevel=4)


def scheduler_binding(scheduler: Any, optimizer: Any, saved_optimizer: dict[str, Any],
                      saved_scheduler: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run ``scheduler`` is bound to on resuming: the checkpoint's, at the trainer's lr (None: nothing to bind).

    Checked here, on a copy, so a refused one changes nothing.
    """
    binding = None if saved_scheduler is None else saved_scheduler.get("binding")
    if scheduler is None or not isinstance(binding, dict):
        return None
    binding = dict(binding)
    if (saved_optimizer.get("hyperparameters") or {}).get("lr") != optimizer.lr:
        binding["base_lr"] = optimizer.lr  # the trainer's lr wins
    try:
        type(scheduler)(**scheduler.get_config()).bind(**binding)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"the trainer's scheduler {scheduler!r} cannot serve the checkpoint's run "
                              f"{binding}: {exc}") from None
    return binding
