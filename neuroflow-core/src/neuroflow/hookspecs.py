"""Hook contracts for ``neuroflow_plugins`` entry points.

Every hook is keyword-only: implement it with the argument names you need,
in any order, and ignore the rest; new arguments can be added without
breaking existing plugins.

An implementation that raises is named: the caller gets a
:class:`~neuroflow.errors.PluginHookError` saying which plugin (and
distribution) raised in which hook, chained to the original exception, and
``neuroflow plugins`` shows the plugin as failed for the rest of the
process. A plugin cannot take a name (an op, a backend...) that the core or
another installed distribution already provides: it is refused and listed.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("neuroflow")
hookimpl = pluggy.HookimplMarker("neuroflow")


@hookspec
def neuroflow_train_start(trainer: Any) -> None:
    """Called once by ``Trainer.fit`` before the first step.

    ``trainer`` is the Trainer, with its model already on its backend.
    The return value is ignored.
    """


@hookspec
def neuroflow_step_end(trainer: Any, step: int, loss: float) -> None:
    """Called after every optimisation step.

    ``step`` counts optimisation steps from 1; ``loss`` is the step's mean
    loss over its micro-batches. Keep it cheap: it runs on the hot path.
    """


@hookspec
def neuroflow_epoch_end(trainer: Any, epoch: int, metrics: dict[str, float]) -> None:
    """Called after each epoch of ``Trainer.fit`` with that epoch's metrics.

    ``epoch`` counts from 1; ``metrics`` holds ``loss``, ``accuracy`` and,
    with validation data, ``val_loss`` and ``val_accuracy``. Mutating it
    changes the history.
    """


@hookspec
def neuroflow_train_end(trainer: Any, history: list[dict[str, float]]) -> None:
    """Called once when ``Trainer.fit`` finishes or stops, with the per-epoch history.

    It cannot change how the run ends: if it raises after training
    succeeded, ``fit`` still returns the History, warns
    (:class:`~neuroflow.errors.PluginWarning`) and keeps the error in
    ``history.hook_errors``; if training failed, ``fit`` raises the
    training error, with the hook's error added as a note.
    """


@hookspec(firstresult=True)
def neuroflow_select_backend(available: list[str]) -> str | None:
    """Called when the backend ``auto`` is asked for; stops at the first non-None result.

    ``available`` lists the installed backend names; return one of them,
    or None to let the next plugin (and finally ``cpu``) decide.
    """


@hookspec
def neuroflow_register_commands(register: Any) -> None:
    """Called when the CLI builds its commands.

    Call ``register(name, help, configure, run)`` for each command:
    ``configure(parser)`` adds arguments to an argparse parser,
    ``run(args) -> int`` executes it and returns the exit code.
    """
