"""Trainer: fits a model with a loss and an optimizer on one backend, step by explicit step.

The Trainer holds its parts and hands work to them: the options
(:mod:`.options`), the memory it trains in (:class:`.session.MemorySession`),
one optimisation step (:class:`.step.OptimisationStep`), the epoch loop
(:mod:`.loop`), evaluation and prediction (:mod:`.inference`) and its
checkpoints (:mod:`.checkpointing`).
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow import debug as debug_checks
from neuroflow import optim, random
from neuroflow.backends.selection import get_backend
from neuroflow.data import DataLoader, as_dataset
from neuroflow.errors import ConfigError
from neuroflow.history import History
from neuroflow.losses.base import Loss
from neuroflow.losses.cross_entropy import CrossEntropy
from neuroflow.memory.compression import build_compressor
from neuroflow.operator import Operator
from neuroflow.plugins import call_hook, end_training
from neuroflow.progress import print_epoch_metrics
from neuroflow.trainer import budget, inference
from neuroflow.trainer.checkpointing import Checkpointing
from neuroflow.trainer.data_parallel import DataParallel, guard
from neuroflow.trainer.loop import EpochRunner, Interruption
from neuroflow.trainer.options import TrainerOptions
from neuroflow.trainer.session import MemorySession
from neuroflow.trainer.step import OptimisationStep
from neuroflow.trainer.threads import TrainingThread, trains


class Trainer:
    """Trains ``model`` by minimising ``loss`` with ``optimizer`` on ``device``.

    ``batch_size`` is the micro-batch run at once; with
    ``gradient_accumulation_steps=k`` an optimisation step accumulates k
    micro-batches, which gives exactly the update of one batch of
    ``batch_size × k``. Parameters and their gradients live in one flat
    buffer each; every op's outputs come from a buffer pool, so after the
    first step a training step allocates no new arrays. The model holds the
    pool only while a trainer call runs: between calls, ``model.forward(x)``
    returns arrays of its own, which later calls leave alone.

    ``gradient_compression`` ("topk" with ``compression_ratio``, "threshold"
    with ``compression_threshold``, or "auto"; off by default) lets each step
    apply only the largest gradient entries per layer and carries the rest to
    the next step in an exact error-feedback residual; see
    :mod:`neuroflow.memory.compression` for what it saves and costs.

    ``update_in_backward=True`` (cpu backend; not with clipping, compression,
    accumulation or offloading) applies the update of every parameter whose
    op writes its gradient whole (convolution and linear weights) as soon as
    backward has produced it: those gradients then live in the planned arena
    for a moment instead of in a buffer the size of the model, and after a
    step their ``param.grad`` is None. The first step runs as usual and
    finds them; the second is traced again. The updates are the same values.

    Threads: ``predict`` and ``evaluate`` may be called from any thread at
    any time. Calls that run the model take turns (the planned buffers and
    the forward state each op keeps are the model's, one call's at a time):
    a prediction waits for the call running, a training step included, and
    then sees the weights of the last finished step; a step waits for a
    running prediction. One thread trains a trainer at a time: ``fit``,
    ``train_step``, ``resume`` or ``save_checkpoint`` from a second thread
    while one trains raises :class:`~neuroflow.errors.TrainerInUseError`.
    ``model.forward`` called directly is not thread-safe (an Operator keeps
    its forward state on itself): use ``predict``, or one model per thread.

    Every keyword argument is a field of :class:`TrainerOptions`, which a
    config file and the command line fill in the same way; ``options=``
    passes one whole.
    """

    def __init__(self, model: Operator, loss: Loss | None = None, optimizer: Any = None, scheduler: Any = None,
                 *, options: TrainerOptions | None = None, **settings: Any) -> None:
        if not isinstance(model, Operator):
            raise TypeError(f"Trainer needs an Operator model; got {type(model).__name__}")
        if options is not None and settings:
            raise TypeError(f"Trainer takes options= or keyword settings, not both; got {', '.join(settings)}")
        self.options = options = options if options is not None else TrainerOptions.from_arguments(settings)
        self.loss = loss if loss is not None else CrossEntropy()
        self.optimizer = optimizer if optimizer is not None else optim.AdamW(lr=1e-3)
        self.scheduler = scheduler
        self.backend = get_backend(options.device)
        self.loss.to(self.backend)  # its fused kernels (softmax-cross-entropy) replace generic code
        self.seed = random.child_seed() if options.seed is None else int(options.seed)
        self.epoch = 0
        self.history = History()
        if options.debug:
            debug_checks.set_enabled(True)
        compressor = build_compressor(options.gradient_compression, options.compression_ratio,
                                      options.compression_threshold)
        self.memory = MemorySession(model, self.loss, self.optimizer, self.backend, options, compressor)
        self.training_thread = TrainingThread()
        if options.update_in_backward:
            self.memory.check_streaming(options.clip_grad_norm)
        self._interruption = Interruption()
        #: the data-parallel part (``distributed=``), or None when this process trains alone
        self.parallel = DataParallel.from_options(options, self._interruption)
        # The parts call back through weak references: a Trainer nothing refers to is freed at once, and with it
        # the checkpoint directory it holds (neuroflow.checkpoint.lock).
        self._steps = OptimisationStep(self.memory, scheduler, options.clip_grad_norm, options.update_in_backward,
                                       _weakly(self._step_ended), self.parallel, options.replay_steps)
        self.checkpoints = Checkpointing(options.checkpoint_dir, options.checkpoint_every, options.keep_checkpoints,
                                         writes=self.is_root)
        self._epochs = EpochRunner(self._steps, self._interruption, options.augment, _weakly(self._after_step),
                                   self.progress, options.max_steps)

    # ------------------------------------------------------------------ what the parts hold
    @property
    def model(self) -> Operator:
        """The model trained; setting another (e.g. the LoRA-fused one) packs it anew before the next step."""
        return self.memory.model

    @model.setter
    def model(self, model: Operator) -> None:
        self.memory.use_model(model)

    @property
    def step(self) -> int:
        """Optimisation steps taken (restored by :meth:`resume`)."""
        return self._steps.count

    @step.setter
    def step(self, value: int) -> None:
        self._steps.count = int(value)

    @property
    def batch_size(self) -> int:
        """The micro-batch: ``batch_size`` as asked, or what a memory budget chose."""
        return self.memory.batch_size

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per step: as asked, or what a memory budget chose."""
        return self.memory.accumulation

    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm before clipping, at the last step (with ``clip_grad_norm``)."""
        return self._steps.last_grad_norm

    @property
    def compressor(self) -> Any:
        """The gradient compressor, or None."""
        return self.memory.compressor

    @property
    def offload(self) -> Any:
        """The offload manager (``enable_async_unload``), once training has set up; else None."""
        return self.memory.offload

    @property
    def memory_report(self) -> Any:
        """The memory profile a budget was fitted with (``memory_budget_mb``), or None."""
        return self.memory.memory_report

    @property
    def flat_parameters(self) -> Any:
        """The flat parameter and gradient buffers the optimizer updates."""
        return self.memory.ready()

    @property
    def progress(self) -> bool:
        """Whether this trainer prints progress: as asked, on rank 0 alone in a data-parallel run."""
        return self.options.progress and self.is_root

    @property
    def is_root(self) -> bool:
        """Whether this process prints and writes files: it trains alone, or is rank 0 of a data-parallel run."""
        return self.parallel is None or self.parallel.is_root

    @property
    def epoch_in_progress(self) -> Any:
        """The running sums (loss, correct, seen) of the epoch ``fit`` is in, which step checkpoints save; else None."""
        return self._epochs.totals

    @property
    def checkpoint_dir(self) -> str | os.PathLike[str] | None:
        return self.options.checkpoint_dir

    def fit_to_budget(self, sample_shape: tuple[int, ...]) -> Any:
        """Choose batch × accumulation so a step fits ``memory_budget_mb``; see :func:`budget.fit_to_budget`."""
        return budget.fit_to_budget(self.memory, sample_shape)

    def memory_stats(self) -> Any:
        """The backend allocator's counters (arena size, bytes in use and at peak, allocations)."""
        return self.backend.memory_stats()

    # ------------------------------------------------------------------ training
    @trains
    def train_step(self, x: Any, y: Any) -> float:
        """One optimisation step on host arrays ``x``, ``y``; returns the mean loss.

        With ``gradient_accumulation_steps=k`` the batch is split into k
        micro-batches whose gradients add up to the whole batch's.
        """
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y):
            raise ConfigError(f"train_step got {len(x)} inputs and {len(y)} targets")
        if len(x) == 0:
            raise ConfigError("train_step got an empty batch")
        if not self.memory.budget_checked:  # before the split: a budget may choose more micro-batches
            budget.fit_to_budget(self.memory, tuple(x.shape[1:]))
        with self.checkpoints.naming_resume_point(), guard(self.parallel):
            loss, _ = self._steps.run(self._steps.split(x, y), count_correct=False)  # no accuracy to report
        return loss

    @trains
    def fit(self, data: Any, epochs: int = 1, val_data: Any = None) -> History:
        """Train for ``epochs`` over ``data``; returns the per-epoch History.

        ``data`` is a dataset, an ``(x, y)`` pair of arrays, or a DataLoader.
        Ctrl-C stops cleanly after the current step (``history.interrupted``).
        After :meth:`resume`, ``fit`` finishes the interrupted run: ``epochs``
        counts from its start.
        """
        if not isinstance(epochs, int) or epochs < 1:
            raise ConfigError(f"epochs must be a positive integer; got {epochs!r}")
        if not self.memory.budget_checked:
            budget.fit_to_budget(self.memory, self._sample_shape_of(data))
        loader = self._loader(data, shuffle=self.options.shuffle)
        steps_per_epoch = math.ceil(len(loader) / self.memory.accumulation)
        if steps_per_epoch == 0:
            raise ConfigError("the training data is empty")
        epochs = self._epochs.epochs_for(epochs, steps_per_epoch)  # max_steps decides the length
        self.memory.ready()
        plan = self.checkpoints.plan(loader, self.epoch, epochs)  # after resume(): the rest of that run
        target = plan.last
        if self.scheduler is not None:
            self.scheduler.bind(self.optimizer.lr, steps_per_epoch, self._epochs.steps_for(steps_per_epoch * target))
        call_hook("neuroflow_train_start", trainer=self)
        try:
            with self._interruption, guard(self.parallel):
                for epoch in range(plan.first, target + 1):
                    if not (plan.continuing and epoch == plan.first):
                        loader.set_epoch(epoch - 1)
                    self.epoch = epoch
                    with self.checkpoints.naming_resume_point():
                        metrics = self._epochs.run(plan.batches(epoch, loader), epoch, target, steps_per_epoch,
                                                   plan.resumed_totals(epoch))
                    if val_data is not None and not self._epochs.stopping:
                        val = self.evaluate(val_data)
                        metrics.update({f"val_{key}": value for key, value in val.items()})
                    call_hook("neuroflow_epoch_end", trainer=self, epoch=self.epoch, metrics=metrics)
                    self.history.append(metrics)
                    if self.checkpoints.every is not None and self._epochs.complete:
                        self.save_checkpoint(loader)  # again, now with the epoch's metrics in the history
                    if self.progress:
                        print_epoch_metrics(self.epoch, target, metrics)
                    if self._epochs.stopping:
                        self.history.interrupted = True
                        break
                    if self._epochs.reached_max_steps:
                        break
        except BaseException as failure:  # the run ends with this error, whatever train_end hooks do
            end_training(self, self.history, failure)
            raise
        end_training(self, self.history)  # a failing hook is warned about; the History is returned
        return self.history

    def request_stop(self) -> None:
        """Ask ``fit`` to stop after the current step (what Ctrl-C does)."""
        self._interruption.request()

    def _step_ended(self, step: int, loss: float) -> None:
        self.checkpoints.observe(loss)  # the next checkpoint's verdict, good or bad
        call_hook("neuroflow_step_end", trainer=self, step=step, loss=loss)

    def _after_step(self, loader: Any) -> None:
        if self.checkpoints.due(self.step):
            self.save_checkpoint(loader)

    # ------------------------------------------------------------------ checkpoints
    @trains
    def save_checkpoint(self, loader: Any = None) -> Any:
        """Write model, optimizer, scheduler, RNG states, step and data position to ``checkpoint_dir`` atomically."""
        return self.checkpoints.save(self, loader)

    @trains
    def resume(self, checkpoint: str | os.PathLike[str] | None = None) -> Any:
        """Restore the newest checkpoint in ``checkpoint`` (a directory or file; default ``checkpoint_dir``).

        The next ``fit(data, epochs=E)`` then finishes the interrupted run
        of E epochs from the step it stopped at; on cpu the result is bit
        for bit what an uninterrupted run gives, History included. The
        checkpoint's directory is this run's from then on (a live run's is
        refused); the trainer's optimizer hyperparameters and scheduler win
        over the checkpoint's, with a warning naming each difference (see
        :mod:`neuroflow.checkpoint.training`).
        """
        with self.memory.lock:  # a prediction running in another thread ends on the weights it started with
            self.memory.ready()
            return self.checkpoints.resume(self, checkpoint)

    # ------------------------------------------------------------------ inference
    def evaluate(self, data: Any, evaluator: Any = None) -> dict[str, float]:
        """Mean loss (accuracy for classification; ``evaluator``'s or the loss's metrics) over ``data``; any thread."""
        parallel = self.parallel  # each rank evaluates its rows of every batch; the sums are added up
        loader = self._loader(data, shuffle=False, evaluation=True)
        return inference.evaluate(self.memory, loader, self._steps.classification, evaluator,
                                  reduce=None if parallel is None else parallel.reduce_sums)

    def predict(self, x: Any) -> np.ndarray:
        """Model outputs for host array ``x`` as a host array (class probabilities for CrossEntropy).

        Safe from any thread: calls take turns, and one call sees one set of weights (those of the last
        finished step while another thread trains).
        """
        return inference.predict(self.memory, np.asarray(x), self.memory.batch_size)

    # ------------------------------------------------------------------ data
    def _loader(self, data: Any, shuffle: bool, evaluation: bool = False) -> Any:
        if isinstance(data, DataLoader):
            loader = data
        else:
            loader = DataLoader(as_dataset(data), batch_size=self.memory.batch_size, shuffle=shuffle, seed=self.seed)
        if self.parallel is not None:  # the batches stay the global ones; this rank gathers its rows of each
            loader.set_shard(self.parallel.rank, self.parallel.size, short_last=evaluation)  # evaluate scores every row
        return loader

    @staticmethod
    def _sample_shape_of(data: Any) -> tuple[int, ...]:
        dataset = getattr(data, "dataset", None) or as_dataset(data)
        x, _ = dataset[np.arange(1)]
        return tuple(x.shape[1:])


def _weakly(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` (bound) as a callback that does not keep its object alive; a no-op once the object is gone."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    return call
