"""When a Trainer writes its checkpoints, where, and the run a resumed checkpoint leaves to finish."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from neuroflow.checkpoint.training import ResumeInfo, load_training_checkpoint, save_training_checkpoint
from neuroflow.errors import ConfigError

if TYPE_CHECKING:
    from neuroflow.trainer.trainer import Trainer


class Checkpointing:
    """Every ``every`` steps (and at each epoch's end) into ``directory``, the newest ``keep`` kept.

    After :meth:`resume`, ``resumed`` holds what it restored until the next
    ``fit`` takes it with :meth:`take_resumed`.
    """

    def __init__(self, directory: str | os.PathLike[str] | None, every: int | None, keep: int) -> None:
        self.directory = directory
        self.every = every
        self.keep = keep
        self.resumed: ResumeInfo | None = None

    def due(self, step: int) -> bool:
        """Whether step number ``step`` (1-based, just taken) ends with a checkpoint."""
        return self.every is not None and step % self.every == 0

    def save(self, trainer: Trainer, loader: Any = None) -> Any:
        """Write ``trainer``'s whole training state (and ``loader``'s position) atomically; the file written."""
        if self.directory is None:
            raise ConfigError("save_checkpoint needs Trainer(checkpoint_dir=...)")
        return save_training_checkpoint(trainer, self.directory, self.keep, loader=loader)

    def resume(self, trainer: Trainer, source: str | os.PathLike[str] | None) -> ResumeInfo:
        """Restore the newest checkpoint in ``source`` (a directory or file; default ``directory``) into ``trainer``."""
        source = source if source is not None else self.directory
        if source is None:
            raise ConfigError("resume needs a checkpoint directory or file")
        info = load_training_checkpoint(trainer, source)
        self.resumed = info
        return info

    def take_resumed(self) -> ResumeInfo | None:
        """What the last :meth:`resume` restored, once: the next ``fit`` finishes that run."""
        info, self.resumed = self.resumed, None
        return info
