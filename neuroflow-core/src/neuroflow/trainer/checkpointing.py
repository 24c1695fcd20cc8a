"""When a Trainer writes its checkpoints, where, the run they belong to, and the run a resumed checkpoint leaves to finish."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuroflow.checkpoint.directory import checkpoint_at
from neuroflow.checkpoint.run import TrainingRun
from neuroflow.checkpoint.training import ResumeInfo, load_training_checkpoint, save_training_checkpoint
from neuroflow.errors import ConfigError, NonFiniteDataError, NonFiniteLossError
from neuroflow.trainer.loop import EpochTotals

if TYPE_CHECKING:
    from neuroflow.trainer.trainer import Trainer


@dataclass(frozen=True)
class EpochPlan:
    """The epochs a ``fit`` runs, ``first`` to ``last``, and how the first one starts.

    ``continuing``: the first epoch goes on where the loader stands (a
    resumed checkpoint's position) instead of from its start; ``totals``:
    the running sums it resumes with; ``finished``: its batches were all
    taken before the checkpoint, so only its History row is left to make.
    """

    first: int
    last: int
    continuing: bool = False
    totals: EpochTotals | None = None
    finished: bool = False

    def batches(self, epoch: int, loader: Any) -> Iterable[Any]:
        """What epoch ``epoch`` takes its batches from."""
        return () if epoch == self.first and self.finished else loader

    def resumed_totals(self, epoch: int) -> EpochTotals | None:
        return self.totals if epoch == self.first else None


class Checkpointing:
    """Every ``every`` steps (and at each epoch's end) into ``directory``, the newest ``keep`` kept.

    ``run`` is the training run the checkpoints belong to: it holds the
    directory from the first write (or :meth:`resume`) until the trainer is
    garbage-collected, judges each checkpoint good or bad from the step
    losses it is given (:meth:`observe`), and keeps the newest good one
    whatever ``keep`` says (:mod:`neuroflow.checkpoint.divergence`). With
    ``writes=False`` (a data-parallel rank other than 0) nothing is written
    and the directory is not claimed; the verdicts are still kept. After
    :meth:`resume`, ``resumed`` holds what it restored until the next ``fit``
    takes it with :meth:`take_resumed`.
    """

    def __init__(self, directory: str | os.PathLike[str] | None, every: int | None, keep: int,
                 writes: bool = True) -> None:
        self.directory = directory
        self.writes = writes
        self.every = every
        self.keep = keep
        self.run = TrainingRun()
        self.resumed: ResumeInfo | None = None

    def due(self, step: int) -> bool:
        """Whether step number ``step`` (1-based, just taken) ends with a checkpoint."""
        return self.every is not None and step % self.every == 0

    def observe(self, loss: float) -> None:
        """Count one step's loss towards the next checkpoint's verdict."""
        self.run.losses.observe(loss)

    def save(self, trainer: Trainer, loader: Any = None) -> Any:
        """Write ``trainer``'s whole training state (and ``loader``'s position) atomically; the file written."""
        if self.directory is None:
            raise ConfigError("save_checkpoint needs Trainer(checkpoint_dir=...)")
        if not self.writes:
            return None
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

    def plan(self, loader: Any, epoch: int, epochs: int) -> EpochPlan:
        """The epochs ``fit(epochs=epochs)`` runs from epoch ``epoch`` (the last one begun), after a resume or not.

        Without a resume: the next ``epochs`` epochs. After :meth:`resume`, the
        interrupted run of ``epochs`` epochs is finished: ``loader`` is put at
        the checkpoint's position, and an epoch the checkpoint was written in
        the middle of (or after its last step but before its row) continues
        with its saved running sums, so its row equals an uninterrupted run's.
        """
        if self.every is not None and self.directory is not None and self.writes:
            self.run.claim(self.directory)  # a second run in the directory is refused before its first step
        resumed = self.take_resumed()
        if resumed is None:
            return EpochPlan(epoch + 1, epoch + epochs)
        if epochs < epoch:
            raise ConfigError(f"the checkpoint is in epoch {epoch}; fit(epochs={epochs}) would end before it")
        state = resumed.data
        if state is None:
            return EpochPlan(epoch + 1, epochs)
        loader.load_state_dict(state)
        # the loader's epochs count from 0; a position of 0 means the saved epoch had finished
        first, continuing = int(state["epoch"]) + 1, int(state["position"]) > 0
        if resumed.epoch_totals is None:
            return EpochPlan(first, epochs, continuing)
        totals = EpochTotals.from_state(resumed.epoch_totals)
        return EpochPlan(totals.epoch, epochs, True, totals, finished=not continuing)

    def newest_good(self) -> Path | None:
        """This run's newest checkpoint in ``directory`` judged good, or None."""
        return None if self.directory is None else checkpoint_at(self.directory, self.run.losses.newest_good)

    @contextlib.contextmanager
    def naming_resume_point(self) -> Iterator[None]:
        """A NonFiniteLossError raised in the block names the checkpoint to resume from: the newest good one
        (training from the newest one led to the non-finite loss). Not when the data are at fault
        (NonFiniteDataError): the newest checkpoint is then as good as any, and ``resume()`` takes it."""
        try:
            yield
        except NonFiniteLossError as error:
            wrote = self.run.losses.pending is not None  # this run has checkpoints (written, or resumed from)
            if wrote and not isinstance(error, NonFiniteDataError):
                error.name_checkpoint(self.newest_good(), self.directory)
            raise
