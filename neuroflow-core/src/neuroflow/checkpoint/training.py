"""Training checkpoints: everything a Trainer needs to continue as if it had never stopped.

A checkpoint is a model file (format ``neuroflow.training``, so ``nf.load``
opens it too) whose tensors also hold the optimizer state (``optimizer::exp_avg``)
and whose ``training`` metadata holds the step and epoch, the history, the
trainer's seed, the scheduler, every random generator (the process generator
and each op's own ``rng``, e.g. Dropout's) and, when given, the DataLoader's
position. Files are ``ckpt-{step:08d}.safetensors``, written atomically; the
newest ``keep`` are kept, so a crash during a write leaves the previous ones intact.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroflow import random
from neuroflow.checkpoint import topology
from neuroflow.checkpoint.atomic import TEMP_SUFFIX
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
from neuroflow.operator import Operator

if TYPE_CHECKING:
    from neuroflow.data.loader import DataLoader
    from neuroflow.trainer import Trainer

NAME_FORMAT = "ckpt-{step:08d}.safetensors"
#: Stored beside the optimizer state: gradient compression's error-feedback residual.
RESIDUAL = "compression_residual"
_NAME = re.compile(r"ckpt-(\d{8,})\.safetensors")


@dataclass(frozen=True)
class ResumeInfo:
    """What :func:`load_training_checkpoint` restored: the file, the step and epoch, the data position."""

    path: Path
    step: int
    epoch: int
    data: dict[str, int] | None


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints in ``directory``, oldest step first (by file name; temporary files are not listed)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint of the highest step in ``directory``, or None when there is none."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


# --------------------------------------------------------------------------- saving
def save_training_checkpoint(
    trainer: Trainer, directory: str | os.PathLike[str], keep: int = 3, *, loader: DataLoader | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``trainer``'s full state to ``directory/ckpt-{step:08d}.safetensors`` atomically; returns the path.

    Keeps the newest ``keep`` checkpoints and removes older ones and the
    temporary files of interrupted writes. ``loader`` (a DataLoader) adds its
    position, so resuming continues mid-epoch. Weights that are NaN or
    infinite are refused, so the last good checkpoint is never replaced by a bad one.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(f"keep must be an integer >= 1; got {keep!r}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
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
    meta["training"] = compact_json({
        "step": int(trainer.step), "epoch": int(trainer.epoch), "seed": int(trainer.seed),
        "history": {"epochs": trainer.history.epochs, "interrupted": bool(trainer.history.interrupted)},
        "optimizer": optimizer,
        "scheduler": _scheduler_state(trainer.scheduler),
        "compression": _compression_settings(compressor),
        "rng": {"process": _encode(random.generator().bit_generator.state),
                "ops": {path: _encode(rng.bit_generator.state) for path, rng in _op_generators(model).items()}},
        "data": None if loader is None else loader.state_dict(),
    })
    path = write_model_file(folder / NAME_FORMAT.format(step=trainer.step), tensors, meta)
    _prune(folder, keep, path)
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


def _prune(folder: Path, keep: int, written: Path) -> None:
    for old in list_checkpoints(folder)[:-keep]:
        if old != written:
            old.unlink(missing_ok=True)
    for stale in folder.glob(f".ckpt-*{TEMP_SUFFIX}"):  # left by a write that was killed
        stale.unlink(missing_ok=True)


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

    The trainer's model must have the checkpoint's topology and its optimizer
    and scheduler the saved types. Everything is read and checked before the
    trainer is changed, so a refused checkpoint leaves it as it was. Given a
    directory, a corrupt newest checkpoint is skipped with a warning in favour
    of the one before it.
    """
    target = Path(path_or_directory)
    if not target.is_dir():
        return _restore(trainer, target, loader)
    candidates = list_checkpoints(target)
    if not candidates:
        raise CheckpointError(f"no checkpoints (ckpt-*.safetensors) in {target}")
    failures = []
    for path in reversed(candidates):
        try:
            return _restore(trainer, path, loader)
        except CheckpointError as exc:
            failures.append(str(exc))
            warnings.warn(f"skipping checkpoint {path.name}: {exc}", RuntimeWarning, stacklevel=2)
    raise CheckpointError(f"no usable checkpoint in {target}: " + " | ".join(failures))


def _restore(trainer: Trainer, path: Path, loader: DataLoader | None) -> ResumeInfo:
    opened = open_model_file(path, formats=(TRAINING_FORMAT,))
    state = _training_state(opened)
    model: Operator = trainer.model
    _check_same_model(model, opened)
    optimizer = state["optimizer"]
    names = opened.optimizer_tensors
    check_tensors(model, opened)
    if optimizer.get("type") != type(trainer.optimizer).__name__:
        raise CheckpointError(f"{path}: saved with optimizer {optimizer.get('type')}; the trainer has "
                              f"{type(trainer.optimizer).__name__}")
    saved_compression = state.get("compression")
    own_compression = _compression_settings(trainer.compressor)
    if saved_compression != own_compression:
        raise CheckpointError(f"{path}: saved with gradient compression {saved_compression}; the trainer has "
                              f"{own_compression}: resume with the same gradient_compression settings")
    saved_scheduler = state["scheduler"]
    if (saved_scheduler is None) != (trainer.scheduler is None):
        raise CheckpointError(f"{path}: saved {'without' if saved_scheduler is None else 'with'} a scheduler; "
                              f"the trainer has {trainer.scheduler!r}")
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
        trainer.optimizer.load_state_dict({**optimizer, "state": saved_state})
        if trainer.compressor is not None:
            if residual is None:
                raise CheckpointError(f"{path}: the gradient-compression residual is missing")
            trainer.compressor.load_residual(residual)
        if saved_scheduler is not None:
            trainer.scheduler.load_state_dict(saved_scheduler["state"])
            if saved_scheduler["binding"] is not None:
                trainer.scheduler.bind(**saved_scheduler["binding"])
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
    return ResumeInfo(opened.header.path, state["step"], state["epoch"], state["data"])


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
    state.setdefault("data", None)
    return state


def _check_same_model(model: Operator, opened: ModelFile) -> None:
    def types(node: dict[str, Any]) -> Any:
        return node["type"], [types(child) for child in node.get("children", [])]

    if types(topology.describe(model)["root"]) != types(opened.topology["root"]):
        raise CheckpointError(f"{opened.source} was saved from a model of another topology than the trainer's")
