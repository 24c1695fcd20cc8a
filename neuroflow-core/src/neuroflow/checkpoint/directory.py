"""What a checkpoint directory holds: each checkpoint's step and run; which one to resume; what to prune.

A directory may hold the checkpoints of several runs one after another (a
run that died and a fresh one started in its place): each checkpoint names
its run. The run that wrote last is the directory's *current* run; resuming
the directory resumes it, and a run prunes only its own checkpoints.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from neuroflow.checkpoint import container
from neuroflow.checkpoint.atomic import remove_stale_temps
from neuroflow.checkpoint.errors import CheckpointError

NAME_FORMAT = "ckpt-{step:08d}.safetensors"
_NAME = re.compile(r"ckpt-(\d{8,})\.safetensors")


@dataclass(frozen=True)
class Entry:
    """One checkpoint file: its step (from the name), run id, and when it was saved.

    ``readable`` is False for a file whose header cannot be read; ``run`` is
    None for it and for one written before checkpoints named their run, and
    ``saved_at`` is then the file's modification time.
    """

    path: Path
    step: int
    run: str | None
    saved_at: float
    readable: bool = True


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints in ``directory``, oldest step first (by file name; temporary files are not listed)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def entries(directory: str | os.PathLike[str]) -> list[Entry]:
    """Every checkpoint in ``directory`` with what its header says about it, oldest step first."""
    return [_entry(path) for path in list_checkpoints(directory)]


def _entry(path: Path) -> Entry:
    step = int(_NAME.fullmatch(path.name).group(1))  # type: ignore[union-attr]
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    try:
        training = json.loads(container.read_header(path).metadata.get("training", "{}"))
    except (CheckpointError, OSError, ValueError, RecursionError):
        return Entry(path, step, None, mtime, readable=False)
    run = training.get("run") if isinstance(training, dict) else None
    run_id = run.get("id") if isinstance(run, dict) and isinstance(run.get("id"), str) else None
    saved_at = run.get("saved_at") if isinstance(run, dict) else None
    return Entry(path, step, run_id, float(saved_at) if isinstance(saved_at, int | float) else mtime)


def current_run(found: list[Entry]) -> str | None:
    """The run of the checkpoint saved last (None for a directory of checkpoints that name no run)."""
    readable = [e for e in found if e.run is not None]
    if not readable:
        return None
    return max(readable, key=lambda e: (e.saved_at, e.step)).run


def resume_candidates(found: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """What resuming the directory tries, newest step first: the current run's checkpoints and the
    unreadable ones (each is tried and skipped with a warning); and the other runs' checkpoints, left alone.
    Where no checkpoint names its run (written by an older NeuroFlow), every one is a candidate."""
    run = current_run(found)
    mine = [e for e in found if run is None or e.run == run or not e.readable]
    others = [e for e in found if e not in mine]
    return mine[::-1], others


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint resuming ``directory`` starts from: the highest step of the run that saved last."""
    candidates, _ = resume_candidates(entries(directory))
    return candidates[0].path if candidates else None


def checkpoint_at(directory: str | os.PathLike[str], step: int | None) -> Path | None:
    """The checkpoint of ``step`` in ``directory`` when that file exists, else None."""
    if step is None:
        return None
    path = Path(directory) / NAME_FORMAT.format(step=step)
    return path if path.is_file() else None


def describe_runs(found: list[Entry]) -> str:
    """``run R: steps a-b`` for each run in ``found`` (for messages)."""
    steps: dict[str, list[int]] = {}
    for e in found:
        steps.setdefault(e.run or "unknown", []).append(e.step)
    return "; ".join(f"run {run}: {_span(s)}" for run, s in steps.items())


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {min(steps)}-{max(steps)}"


def prune(folder: Path, keep: int, run: str, written: Path, good: Path | None) -> list[Path]:
    """Remove ``run``'s checkpoints but its newest ``keep``, ``written`` and ``good`` (its newest good one),
    and the stale temporary files.

    Checkpoints of other runs are left alone. The caller holds the
    directory's lock, so temporary checkpoint files of writers that are not
    alive on this host are stale. Returns the checkpoints removed.
    """
    mine = [e for e in entries(folder) if e.run == run]
    kept = {e.path for e in mine[-keep:]} | {written, good}
    removed = []
    for e in mine:
        if e.path not in kept:
            e.path.unlink(missing_ok=True)
            removed.append(e.path)
    remove_stale_temps(folder, exclusive=True, prefix=".ckpt-")
    return removed


def others_note(folder: Path, run: str) -> str | None:
    """A warning when ``folder`` holds checkpoints of runs other than ``run`` (a fresh run's first write)."""
    others = [e for e in entries(folder) if e.run != run]
    if not others:
        return None
    return (f"checkpoint directory {folder} holds {len(others)} checkpoint(s) of another run ({describe_runs(others)}); "
            f"this run ({run}) leaves them in place, prunes only its own, replaces any at a step it writes, and "
            "resuming the directory will continue this run. Use one checkpoint_dir per run to keep them apart")
