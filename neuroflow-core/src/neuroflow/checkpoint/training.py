"""Training checkpoints: everything a Trainer needs to continue as if it had never stopped.

A checkpoint is a model file (format ``neuroflow.training``, so ``nf.load``
opens it too) whose tensors also hold the optimizer state (``optimizer::exp_avg``)
and whose ``training`` metadata holds the step and epoch, the history, the
trainer's seed, the scheduler, every random generator (the process generator
and each op's own ``rng``, e.g. Dropout's) and, when given, the DataLoader's
position; the run it belongs to; the epoch in progress (its running loss
sum, correct predictions and samples seen, so a resumed epoch's History row
equals the uninterrupted one's); and the verdict on the losses since the
checkpoint before, which says whether that one is good, with the newest
good checkpoint so far (the rule is in :mod:`neuroflow.checkpoint.divergence`).
Files are ``ckpt-{step:08d}.safetensors``,
written atomically into a directory the run holds
(:mod:`neuroflow.checkpoint.lock`); each run keeps its newest ``keep`` and
its newest good one, so neither a crash during a write nor a diverging run
loses the last good state.

Resuming restores the *state*: weights, optimizer state, step, random
generators, data position, History. The *configuration* is the resuming
trainer's: where its optimizer hyperparameters (``lr``, ``weight_decay``...)
or its scheduler differ from the checkpoint's, a warning names each
difference and the trainer's values are used from the resumed step on (so
resuming with a lower ``lr`` works). A different optimizer type, model or
gradient compression is refused: their state cannot carry over.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroflow import random
from neuroflow.checkpoint import directory as listing
from neuroflow.checkpoint import resume_settings, topology
from neuroflow.checkpoint.directory import NAME_FORMAT, latest_checkpoint, list_checkpoints
from neuroflow.checkpoint.divergence import Verdict, verdict_from
from neuroflow.checkpoint.errors import CheckpointError
from neuroflow.checkpoint.model_file import (
    OPTIMIZER_PREFIX,
    TRAINING_FORMAT,
    ModelFile,
    check_tensors,
    compact_json,
    model_payload,
    open_model_file,
    read_checked,
    write_model_file,
)
from neuroflow.checkpoint.run import TrainingRun
from neuroflow.operator import Operator

if TYPE_CHECKING:
    from neuroflow.data.loader import DataLoader
    from neuroflow.trainer import Trainer

__all__ = ["NAME_FORMAT", "ResumeInfo", "latest_checkpoint", "list_checkpoints", "load_training_checkpoint",
           "save_training_checkpoint"]

#: Stored beside the optimizer state: gradient compression's error-feedback residual.
RESIDUAL = "compression_residual"


@dataclass(frozen=True)
class ResumeInfo:
    """What :func:`load_training_checkpoint` restored: the file, the step and epoch, the data position.

    ``epoch_totals`` holds the running sums of the epoch in progress when the
    checkpoint was written in the middle of one (``{"epoch", "loss_sum",
    "correct", "seen"}``), else None. ``verdict`` is the verdict on the
    window that ended at it (:mod:`neuroflow.checkpoint.divergence`; None for
    a checkpoint from before verdicts), ``newest_good`` the newest checkpoint
    of its run known good then (when the file is still there), ``run`` the id
    of the run the trainer now continues.
    """

    path: Path
    step: int
    epoch: int
    data: dict[str, int] | None
    epoch_totals: dict[str, Any] | None = None
    verdict: Verdict | None = None
    newest_good: Path | None = None
    run: str | None = None
    #: how many data-parallel ranks trained up to it (None: a checkpoint from before this was recorded)
    ranks: int | None = None

    @property
    def diverging(self) -> bool:
        """Whether the loss was exploding in the steps before this checkpoint (it is most likely bad too)."""
        return self.verdict is not None and not self.verdict.good


# --------------------------------------------------------------------------- saving
def save_training_checkpoint(
    trainer: Trainer, directory: str | os.PathLike[str], keep: int = 3, *, loader: DataLoader | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``trainer``'s full state to ``directory/ckpt-{step:08d}.safetensors`` atomically; returns the path.

    The first write takes the directory for the trainer's run (a lock; see
    :mod:`neuroflow.checkpoint.lock`) and is refused while another live run
    holds it. Keeps the run's newest ``keep`` checkpoints and its newest good
    one, removes its older ones and the temporary files of interrupted
    writes; other runs' checkpoints are left alone. ``loader`` (a DataLoader)
    adds its position, so resuming continues mid-epoch. Weights that are NaN
    or infinite are refused, so the last good checkpoint is never replaced by
    a bad one.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(f"keep must be an integer >= 1; got {keep!r}")
    folder = Path(directory)
    run = trainer.checkpoints.run
    run.claim(folder)
    model: Operator = trainer.model
    tensors, meta = model_payload(model, TRAINING_FORMAT, metadata)
    bad = [name for name, a in tensors.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise CheckpointError(f"not saving a checkpoint at step {trainer.step}: {', '.join(bad[:5])} hold NaN or Inf")
    optimizer = trainer.optimizer.state_dict()
    for name, array in optimizer.pop("state").items():
        tensors[OPTIMIZER_PREFIX + name] = np.ascontiguousarray(array)
    compressor = trainer.compressor
    if compressor is not None and compressor.residual is not None:
        # the unsent gradient is training state: without it a resumed run would forget it and diverge
        tensors[OPTIMIZER_PREFIX + RESIDUAL] = np.ascontiguousarray(trainer.backend.to_host(compressor.residual))
    verdict, watch = run.losses.judge(int(trainer.step))
    totals = trainer.epoch_in_progress
    meta["training"] = compact_json({
        "step": int(trainer.step), "epoch": int(trainer.epoch), "seed": int(trainer.seed),
        "ranks": int(getattr(getattr(trainer, "parallel", None), "size", 1)),  # data-parallel ranks
        "run": {"id": run.id, "saved_at": time.time()},
        "verdict": None if verdict is None else verdict.as_json(), "divergence": watch,
        "epoch_totals": None if totals is None else totals.state_dict(),
        "history": {"epochs": trainer.history.epochs, "interrupted": bool(trainer.history.interrupted)},
        "optimizer": optimizer,
        "scheduler": _scheduler_state(trainer.scheduler),
        "compression": _compression_settings(compressor),
        "rng": {"process": _encode(random.generator().bit_generator.state),
                "ops": {path: _encode(rng.bit_generator.state) for path, rng in _op_generators(model).items()}},
        "data": None if loader is None else loader.state_dict(),
    })
    path = write_model_file(folder / NAME_FORMAT.format(step=trainer.step), tensors, meta)
    run.losses.commit(watch)
    listing.prune(folder, keep, run.id, path, listing.checkpoint_at(folder, run.losses.newest_good))
    return path


def _compression_settings(compressor: Any) -> dict[str, Any] | None:
    if compressor is None:
        return None
    return {"mode": compressor.mode, "ratio": compressor.ratio, "threshold": compressor.threshold}


def _scheduler_state(scheduler: Any) -> dict[str, Any] | None:
    if scheduler is None:
        return None
    # bind() sets total_steps >= 1; an unbound scheduler has 0 and nothing to restore but its config.
    binding = None
    if getattr(scheduler, "total_steps", 0):
        binding = {"base_lr": scheduler.base_lr, "steps_per_epoch": scheduler.steps_per_epoch,
                   "total_steps": scheduler.total_steps}
    return {"state": scheduler.state_dict(), "binding": binding}


def _op_generators(model: Operator) -> dict[str, np.random.Generator]:
    """Each op's own random generator (Dropout's masks) by the op's dotted path."""
    found = {}
    for path, op in topology.named_modules(model):
        rng = getattr(op, "rng", None)
        if isinstance(rng, np.random.Generator):
            found[path] = rng
    return found


def _encode(value: Any) -> Any:
    """A bit generator state as JSON (MT19937 keeps a uint32 array in it)."""
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.integer):
        return int(value)
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"ndarray", "dtype"}:
            return np.asarray(value["ndarray"], dtype=np.dtype(value["dtype"]))
        return {key: _decode(item) for key, item in value.items()}
    return value


# --------------------------------------------------------------------------- loading
def load_training_checkpoint(
    trainer: Trainer, path_or_directory: str | os.PathLike[str], *, loader: DataLoader | None = None
) -> ResumeInfo:
    """Restore ``trainer`` (and ``loader``, when given) from a checkpoint file or the newest in a directory.

    The directory (or the file's) is taken for the trainer's run first, as
    at a first write: a live run's directory is refused. Given a directory,
    the newest checkpoint of the run that saved last is restored (the other
    runs' checkpoints are named in a warning and left alone), and a corrupt
    one is skipped with a warning in favour of the one before it. Resuming
    that newest checkpoint continues its run; resuming an older one (a good
    checkpoint before a divergence) starts a new run from it, so the run's
    later checkpoints are never pruned by mistake for newer ones.

    The trainer's model must have the checkpoint's topology and its
    optimizer the saved type; its hyperparameters and scheduler win over the
    checkpoint's, with a warning naming the differences. Everything is read
    and checked before the trainer is changed, so a refused checkpoint
    leaves it as it was.
    """
    target = Path(path_or_directory)
    run = trainer.checkpoints.run
    folder = target if target.is_dir() else target.parent
    if getattr(trainer.checkpoints, "writes", True):  # a data-parallel rank other than 0 writes nothing: no lock
        _claim_to_resume(run, folder)
    found = listing.entries(folder)
    current = listing.current_run(found)
    if not target.is_dir():
        newest = [e.path.resolve() for e in found if e.run is not None and e.run == current][-1:]
        return _restore(trainer, target, loader, continues=newest == [target.resolve()])
    candidates, others = listing.resume_candidates(found)
    if not candidates:
        raise CheckpointError(f"no checkpoints (ckpt-*.safetensors) in {target}")
    if any(e.step > candidates[0].step for e in others):
        warnings.warn(f"{target} also holds checkpoints of other runs ({listing.describe_runs(others)}); resuming "
                      f"run {current}, the run that saved last; pass a checkpoint file to resume another",
                      RuntimeWarning, stacklevel=2)
    failures = []
    for rank, entry in enumerate(candidates):
        try:
            info = _restore(trainer, entry.path, loader, continues=rank == 0)
        except CheckpointError as exc:
            failures.append(str(exc))
            warnings.warn(f"skipping checkpoint {entry.path.name}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        if info.diverging:
            good = info.newest_good
            back = (f"the newest good checkpoint is {good}: resume that file" if good is not None
                    else "no checkpoint of its run is known good: start again")
            warnings.warn(f"resumed {entry.path.name}, written while the loss was exploding (its window: "
                          f"{info.verdict.reason if info.verdict else 'not finite'}); {back}, with a lower lr, to go "
                          "back to where training was sane", RuntimeWarning, stacklevel=2)
        return info
    raise CheckpointError(f"no usable checkpoint in {target}: " + " | ".join(failures))


def _claim_to_resume(run: TrainingRun, folder: Path) -> None:
    if not folder.is_dir():
        return  # nothing to hold; opening the checkpoint says what is missing
    try:
        run.claim(folder, resuming=True)
    except PermissionError:
        pass  # a read-only directory: no run can write there, so there is nothing to hold


def _restore(trainer: Trainer, path: Path, loader: DataLoader | None, *, continues: bool) -> ResumeInfo:
    opened = open_model_file(path, formats=(TRAINING_FORMAT,))
    state = _training_state(opened)
    model: Operator = trainer.model
    _check_same_model(model, opened)
    optimizer = state["optimizer"]
    names = opened.optimizer_tensors
    check_tensors(model, opened)
    if optimizer.get("type") != type(trainer.optimizer).__name__:
        raise CheckpointError(f"{path}: saved with optimizer {optimizer.get('type')}; the trainer has "
                              f"{type(trainer.optimizer).__name__}: its state cannot carry over. Resume with a "
                              f"{optimizer.get('type')}, or start a new run from the weights alone (nf.load)")
    saved_compression = state.get("compression")
    own_compression = _compression_settings(trainer.compressor)
    if saved_compression != own_compression:
        raise CheckpointError(f"{path}: saved with gradient compression {saved_compression}; the trainer has "
                              f"{own_compression}: resume with the same gradient_compression settings")
    saved_scheduler = state["scheduler"]
    differences = resume_settings.optimizer_differences(optimizer, trainer.optimizer)
    differences += resume_settings.scheduler_differences(saved_scheduler, trainer.scheduler)
    binding = resume_settings.scheduler_binding(trainer.scheduler, trainer.optimizer, optimizer, saved_scheduler)
    generators = _op_generators(model)
    saved_generators = state["rng"]["ops"]
    if sorted(generators) != sorted(saved_generators):
        raise CheckpointError(f"{path}: saved random generators of ops {sorted(saved_generators)}; "
                              f"the model has {sorted(generators)}")

    pairs = [(random.generator(), state["rng"]["process"])]
    pairs += [(rng, saved_generators[op_path]) for op_path, rng in generators.items()]
    for rng, saved in pairs:
        kind = type(rng.bit_generator).__name__
        if not isinstance(saved, dict) or saved.get("bit_generator") != kind:
            raise CheckpointError(f"{path}: a saved random generator state is not a {kind} state")

    # Read everything (verifying checksums) before changing anything; each component below checks
    # what it is given before it changes itself.
    with open(opened.header.path, "rb", buffering=0) as handle:
        arrays = {name: read_checked(handle, entry, opened) for name, entry in opened.header.tensors.items()}
    try:
        if loader is not None and state["data"] is not None:
            loader.load_state_dict(state["data"])
        saved_state = {short: arrays[n] for n, short in names.items()}
        residual = saved_state.pop(RESIDUAL, None)
        # the state is the checkpoint's, the hyperparameters the trainer's (see resume_settings)
        trainer.optimizer.load_state_dict({**optimizer, "hyperparameters": trainer.optimizer.get_config(),
                                           "state": saved_state})
        if trainer.compressor is not None:
            if residual is None:
                raise CheckpointError(f"{path}: the gradient-compression residual is missing")
            trainer.compressor.load_residual(residual)
        if binding is not None:
            trainer.scheduler.bind(**binding)
        model.load_state_dict({n: a for n, a in arrays.items() if n not in names})
        for rng, saved in pairs:
            rng.bit_generator.state = _decode(saved)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot restore the training state: {type(exc).__name__}: {exc}") from None
    trainer.step, trainer.epoch, trainer.seed = state["step"], state["epoch"], state["seed"]
    trainer.history.epochs = list(state["history"]["epochs"])
    trainer.history.interrupted = bool(state["history"]["interrupted"])
    run = trainer.checkpoints.run
    saved_run = state["run"].get("id")
    if continues and isinstance(saved_run, str):
        run.adopt(saved_run)
    run.losses.load_state_dict(state["divergence"])
    resume_settings.warn_differences(path, state["step"], differences)
    return ResumeInfo(opened.header.path, state["step"], state["epoch"], state["data"], state["epoch_totals"],
                      verdict_from(state["verdict"]), listing.checkpoint_at(path.parent, run.losses.newest_good),
                      run.id, state.get("ranks"))


def _training_state(opened: ModelFile) -> dict[str, Any]:
    source = opened.source
    try:
        state = json.loads(opened.header.metadata.get("training", ""))
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{source}: training metadata is not valid JSON ({exc})") from None
    shape = {"step": int, "epoch": int, "seed": int, "history": dict, "optimizer": dict, "rng": dict}
    if not isinstance(state, dict) or any(not isinstance(state.get(k), t) for k, t in shape.items()):
        raise CheckpointError(f"{source}: training metadata lacks step, epoch, seed, history, optimizer or rng")
    history, rng = state["history"], state["rng"]
    if not isinstance(history.get("epochs"), list) or not isinstance(rng.get("ops"), dict) or "process" not in rng:
        raise CheckpointError(f"{source}: training metadata has a malformed history or rng section")
    scheduler = state.get("scheduler")
    if scheduler is not None and not (isinstance(scheduler, dict) and isinstance(scheduler.get("state"), dict)):
        raise CheckpointError(f"{source}: training metadata has a malformed scheduler section")
    for key in ("data", "epoch_totals"):
        state.setdefault(key, None)
    for key in ("run", "divergence"):  # absent from checkpoints of older versions
        if not isinstance(state.get(key), dict):
            state[key] = {}
    totals = state["epoch_totals"]
    if totals is not None and not (isinstance(totals, dict) and all(
            isinstance(totals.get(k), int | float) and not isinstance(totals.get(k), bool)
            for k in ("epoch", "loss_sum", "correct", "seen"))):
        raise CheckpointError(f"{source}: training metadata has a malformed epoch_totals section")
    return state


def _check_same_model(model: Operator, opened: ModelFile) -> None:
    def types(node: dict[str, Any]) -> Any:
        return node["type"], [types(child) for child in node.get("children", [])]

    if types(topology.describe(model)["root"]) != types(opened.topology["root"]):
        raise CheckpointError(f"{opened.source} was saved from a model of another topology than the trainer's")
