"""Trainer: fits a model with a loss and an optimizer on one backend, step by explicit step."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from neuroflow import debug as debug_checks
from neuroflow.backends.selection import get_backend
from neuroflow.buffers.flat import FlatParameters
from neuroflow.buffers.pool import BufferPool
from neuroflow.buffers.trace import TracingPool
from neuroflow.composites import input_layer
from neuroflow.errors import ConfigError, NonFiniteLossError
from neuroflow.fusion import fuse
from neuroflow.history import History
from neuroflow.losses.base import Loss
from neuroflow.losses.cross_entropy import CrossEntropy
from neuroflow.memory.compression import GradientCompressor, build_compressor
from neuroflow.memory.offload import OffloadManager
from neuroflow.memory.runtime import MemoryRuntime
from neuroflow.operator import Operator
from neuroflow.progress import EpochProgress, print_epoch_metrics


class Trainer(MemoryRuntime):
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
    """

    def __init__(
        self,
        model: Operator,
        loss: Loss | None = None,
        optimizer: Any = None,
        scheduler: Any = None,
        *,
        device: Any = None,
        batch_size: int = 64,
        gradient_accumulation_steps: int = 1,
        clip_grad_norm: float | None = None,
        seed: int | None = None,
        shuffle: bool = True,
        debug: bool = False,
        progress: bool = True,
        allocator: str | None = None,
        memory_budget_mb: float | None = None,
        memory_pool_size_mb: float | None = None,
        enable_async_unload: bool = False,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 3,
        lora_fusion: bool = False,
        augment: Any = None,
        gradient_compression: str | GradientCompressor | None = None,
        compression_ratio: float | None = None,
        compression_threshold: float | None = None,
        update_in_backward: bool = False,
    ) -> None:
        if not isinstance(model, Operator):
            raise TypeError(f"Trainer needs an Operator model; got {type(model).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer; got {batch_size!r}")
        if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
            raise ConfigError(f"gradient_accumulation_steps must be a positive integer; got {gradient_accumulation_steps!r}")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm must be positive; got {clip_grad_norm!r}")
        if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or checkpoint_every < 1):
            raise ConfigError(f"checkpoint_every must be a positive integer (steps); got {checkpoint_every!r}")
        if checkpoint_every is not None and checkpoint_dir is None:
            raise ConfigError("checkpoint_every needs checkpoint_dir: where to write the checkpoints")
        if not isinstance(keep_checkpoints, int) or keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be a positive integer; got {keep_checkpoints!r}")
        from neuroflow import optim, random

        self.model = model
        self.loss = loss if loss is not None else CrossEntropy()
        self.optimizer = optimizer if optimizer is not None else optim.AdamW(lr=1e-3)
        self.scheduler = scheduler
        self.backend = get_backend(device)
        # Fused kernels of the backend (one-pass optimizer updates, softmax-cross-entropy) replace generic code.
        self.optimizer.backend = self.loss.backend = self.backend
        self.batch_size = batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.clip_grad_norm = clip_grad_norm
        self.seed = random.child_seed() if seed is None else int(seed)
        self.shuffle = shuffle
        self.progress = progress
        self.step = 0
        self.epoch = 0
        self.history = History()
        self.last_grad_norm: float | None = None
        if debug:
            debug_checks.set_enabled(True)
        for name, value in (("memory_budget_mb", memory_budget_mb), ("memory_pool_size_mb", memory_pool_size_mb)):
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be positive; got {value!r}")
        from neuroflow import registry

        self.allocator_name = allocator or os.environ.get("NEUROFLOW_ALLOCATOR") or "arena"
        self._allocator_class = registry.allocators.get(self.allocator_name)
        self.memory_budget_mb = memory_budget_mb
        self.memory_pool_size_mb = memory_pool_size_mb
        self.enable_async_unload = bool(enable_async_unload)
        self.offload: OffloadManager | None = None
        self.memory_report: Any = None
        self._plan: Any = None
        self._planned_batch = 0
        self._budget_checked = memory_budget_mb is None
        self._reserve_per_sample = 0
        self._flat: FlatParameters | None = None
        self._pool: BufferPool | None = None
        self._stop_requested = False
        self._classification = isinstance(self.loss, CrossEntropy)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.keep_checkpoints = keep_checkpoints
        self._resume_data: dict[str, int] | None = None
        self._resumed = False
        self._epoch_complete = False
        self.lora_fusion = bool(lora_fusion)
        if augment is not None and not callable(augment):
            raise ConfigError(f"augment must be callable (a batch of inputs -> augmented inputs); got {augment!r}")
        self.augment = augment  # applied by fit to each training batch, never to evaluation data
        self.compressor = build_compressor(gradient_compression, compression_ratio, compression_threshold)
        self.update_in_backward = bool(update_in_backward)
        if self.update_in_backward:
            self._check_update_in_backward()
        self._streamed: dict[int, slice] | None = None  # parameter id -> its flat slice, once updates stream
        self._step_lr = 0.0

    # ------------------------------------------------------------------ setup
    def _ensure_ready(self) -> None:
        """Place the model on the backend, pack parameters and bind the optimizer (once)."""
        if self.lora_fusion and self._flat is None:
            from neuroflow.lora import mark_only_lora_as_trainable

            mark_only_lora_as_trainable(self.model)  # base weights read-only: no gradient, no optimizer state
        params = self.model.trainable_parameters()
        if self._flat is not None and self._flat.owns(params):
            return
        if self.model._backend is not self.backend:
            self.model.to(self.backend)
            params = self.model.trainable_parameters()
        self._flat = FlatParameters(params, self.backend.xp)
        self._streamed = None  # packed anew, every gradient kept: a first step finds the streamed ones again
        self._step_end_hook = self._hooks().neuroflow_step_end
        self.optimizer.bind(self._flat)
        if self.compressor is not None:
            self.compressor.bind(self._flat, [n for n, p in self.model.named_parameters() if p.requires_grad])
        self._attach(None)
        fuse(self.model)
        self._skip_unused_input_gradient()
        if self.enable_async_unload:
            cold = [t for _, t in self.model.named_buffers()]
            cold += [p for p in self.model.parameters() if not p.requires_grad]
            capacity = self._arena_capacity(0)
            low_water = capacity // 4 if capacity else 64 * 2**20  # a quarter of the pool, or 64 MiB
            self.offload = OffloadManager(self.backend, cold, low_water)

    def _place_model(self) -> None:
        """Put the model on the backend for inference; nothing is packed or bound (a frozen model is fine)."""
        if self.model._backend is not self.backend:
            self.model.to(self.backend)
            self._flat = None  # parameters were rebound; pack again before the next training step

    def _attach(self, pool: Any) -> None:
        self._pool = pool
        if pool is not None:
            pool.gradient_sink = self._apply_streamed_update if self._streamed is not None else None
        self.model.attach_pool(pool)
        self.loss.attach_pool(pool)

    # ------------------------------------------------------------------ updates inside backward
    def _check_update_in_backward(self) -> None:
        conflicts = [name for name, on in (
            ("clip_grad_norm", self.clip_grad_norm is not None),
            ("gradient_compression", self.compressor is not None),
            ("gradient_accumulation_steps > 1", self.gradient_accumulation_steps > 1),
            ("enable_async_unload", self.enable_async_unload),
        ) if on]
        if conflicts:
            raise ConfigError(f"update_in_backward applies each update before the step's other gradients exist; "
                              f"it cannot be combined with {', '.join(conflicts)}")
        if self.backend.xp is not np:
            raise ConfigError(f"update_in_backward runs on the cpu backend only; this trainer is on {self.backend.name!r}")

    def _start_streaming_updates(self) -> None:
        """After the first step: keep no gradient for the parameters whose ops write their gradient whole (a
        convolution's or linear layer's weight), apply their updates as backward produces those gradients, and
        trace the next step again, so that the plan holds each of them for the moment it lives."""
        pool, flat = self._pool, self._flat
        if pool is None or flat is None or not pool.grads_zeroed:
            raise ConfigError("update_in_backward needs each gradient written once per step: one micro-batch, "
                              "and no layer used twice in the model")
        streamed = {id(p): view for p, view in zip(flat.params, flat.slices) if id(p) in pool.whole_gradients}
        flat.drop_gradients(streamed)
        self._streamed = streamed
        self._attach(None)

    def _apply_streamed_update(self, param: Any, gradient: Any) -> bool:
        """The pool's gradient sink: apply this step's update to a streamed parameter; False for the others."""
        view = self._streamed.get(id(param)) if self._streamed is not None else None
        if view is None:
            return False
        self.optimizer.update_slice(view, gradient, self._step_lr)
        return True

    def _update_kept_gradients(self) -> None:
        """After backward, the update of every parameter whose gradient was kept (BatchNorm's, biases added into)."""
        flat = self._flat
        if flat is None or self._streamed is None:  # pragma: no cover - only called while streaming
            return
        for p, view in zip(flat.params, flat.slices):
            if id(p) not in self._streamed and p.grad is not None:
                self.optimizer.update_slice(view, p.grad, self._step_lr)

    def _skip_unused_input_gradient(self) -> None:
        """The model's input needs no gradient: let the first layer skip computing it."""
        first = input_layer(self.model)
        if first is not None:
            first.needs_input_grad = False

    # ------------------------------------------------------------------ memory
    @property
    def flat_parameters(self) -> FlatParameters:
        """The flat parameter and gradient buffers the optimizer updates."""
        self._ensure_ready()
        if self._flat is None:  # pragma: no cover - _ensure_ready always sets it
            raise RuntimeError("trainer is not set up")
        return self._flat

    # ------------------------------------------------------------------ steps
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
        k = min(self.gradient_accumulation_steps, len(x))
        micro = [(x, y)] if k == 1 else list(zip(np.array_split(x, k), np.array_split(y, k)))
        loss, _ = self._optimisation_step(micro)
        return loss

    @contextlib.contextmanager
    def _buffers_lent(self) -> Iterator[None]:
        """Run the model on the trainer's buffers for one call, and take them back after it.

        Between trainer calls the model has no pool, so ``model.forward(x)``
        returns an array of its own, as users expect; inside a call, outputs
        are the planned buffers the next step reuses.
        """
        if self._pool is not None:
            self.model.attach_pool(self._pool)
        try:
            yield
        finally:
            self.model.attach_pool(None)

    def _optimisation_step(self, micro_batches: list[tuple[Any, Any]]) -> tuple[float, int]:
        with self._buffers_lent():
            return self._step_on_buffers(micro_batches)

    def _step_on_buffers(self, micro_batches: list[tuple[Any, Any]]) -> tuple[float, int]:
        self._ensure_ready()
        flat, backend, model, loss_fn = self._flat, self.backend, self.model, self.loss
        if flat is None:  # pragma: no cover
            raise RuntimeError("trainer is not set up")
        if not model.training:
            model.train()
        total = sum(len(x) for x, _ in micro_batches)
        largest = max(len(x) for x, _ in micro_batches)
        if not self._budget_checked:
            self.fit_to_budget(tuple(micro_batches[0][0].shape[1:]))
        if self._pool is not None and largest > self._planned_batch:
            self._attach(None)  # a larger batch than planned: trace and plan again
        if self.offload is not None:
            self.offload.ensure_loaded()
        pool = self._pool
        streaming = self._streamed is not None
        flat.zero_grad(pool.whole_gradients if pool is not None and pool.grads_zeroed and not streaming else ())
        lr = self.scheduler.lr(self.step) if self.scheduler is not None else None
        loss_sum = 0.0
        correct = 0
        for x, y in sorted(micro_batches, key=lambda b: -len(b[0])):
            tracer = None
            if self._pool is None:
                tracer = TracingPool(backend.xp)
                tracer.grads_zeroed = self._grads_zeroed()
                self._sample_shape = tuple(x.shape[1:])
                self._attach(tracer)
            xd, yd = backend.from_host(x), backend.from_host(y)
            out = model.forward(xd)
            # the logits are small ((batch, classes)): counted on the host, their copy started before the loss
            # so that the loss's read back is the only wait
            logits = backend.start_to_host(out) if self._classification else None
            value = loss_fn.forward(out, yd)
            if not math.isfinite(value):
                raise NonFiniteLossError(self.step + 1, value, self._first_nonfinite_layer(xd))
            if logits is not None:
                correct += int((logits().argmax(axis=1) == y).sum())
            if streaming:  # one micro-batch: the step is counted once its loss is known to be finite
                self._step_lr = self.optimizer.begin_step(lr)
            g = loss_fn.backward(scale=len(x) / total)
            gx = model.backward(g)
            if tracer is not None:
                tracer.handoff(g, gx, model)
                tracer.release(gx)
                tracer.done(loss_fn)
                self._finish_trace(tracer, len(x))
                # The traced arrays are views of one reservation: any one left alive keeps all its pages resident
                # through the optimizer step, whose first call allocates the optimizer's state.
                xd = yd = out = g = gx = logits = None
            loss_sum += value * len(x)
        if streaming:
            self._update_kept_gradients()
        else:
            if self.compressor is not None:
                self.compressor.compress(flat.grad)  # the optimizer (and clipping) see only what is sent
            if self.clip_grad_norm is not None:
                from neuroflow.optim.clip import clip_grad_norm

                self.last_grad_norm = clip_grad_norm(flat.grad, self.clip_grad_norm)
            self.optimizer.step(lr)
            if self.update_in_backward:
                self._start_streaming_updates()
        if self.offload is not None:
            self.offload.after_step()
        self.step += 1
        mean_loss = loss_sum / total
        self._step_end_hook(trainer=self, step=self.step, loss=mean_loss)
        return mean_loss, correct

    def _first_nonfinite_layer(self, x: Any) -> str | None:
        """Re-run the forward layer by layer to name the first layer whose output is not finite."""
        xp = self.backend.xp
        layers = getattr(self.model, "layers", None)
        if not layers:
            return None
        h = x
        for i, layer in enumerate(layers):
            h = layer.forward(h)
            if not bool(xp.isfinite(h).all()):
                return f"{i} ({layer!r})"
        return None

    # ------------------------------------------------------------------ loops
    def fit(self, data: Any, epochs: int = 1, val_data: Any = None) -> History:
        """Train for ``epochs`` over ``data``; returns the per-epoch History.

        ``data`` is a dataset, an ``(x, y)`` pair of arrays, or a DataLoader.
        Ctrl-C stops cleanly after the current step (``history.interrupted``).
        """
        if not isinstance(epochs, int) or epochs < 1:
            raise ConfigError(f"epochs must be a positive integer; got {epochs!r}")
        if not self._budget_checked:
            self.fit_to_budget(self._sample_shape_of(data))
        loader = self._loader(data, shuffle=self.shuffle)
        k = self.gradient_accumulation_steps
        steps_per_epoch = math.ceil(len(loader) / k)
        if steps_per_epoch == 0:
            raise ConfigError("the training data is empty")
        self._ensure_ready()
        resumed, self._resumed = self._resumed, False
        if resumed:
            # fit after resume() finishes the interrupted run: ``epochs`` counts from its start.
            if epochs < self.epoch:
                raise ConfigError(f"the checkpoint is in epoch {self.epoch}; fit(epochs={epochs}) would end before it")
            state = self._resume_data
            if state is not None:
                loader.load_state_dict(state)
            # the loader's epochs count from 0; a position of 0 means the saved epoch had finished
            first = int(state["epoch"]) + 1 if state is not None else self.epoch + 1
            continuing = state is not None and int(state["position"]) > 0
            target = epochs
        else:
            first, target, continuing = self.epoch + 1, self.epoch + epochs, False
        self._resume_data = None
        if self.scheduler is not None:
            self.scheduler.bind(self.optimizer.lr, steps_per_epoch, steps_per_epoch * target)
        hooks = self._hooks()
        hooks.neuroflow_train_start(trainer=self)
        self._stop_requested = False
        previous_handler = self._install_interrupt_handler()
        try:
            for epoch in range(first, target + 1):
                if not (continuing and epoch == first):
                    loader.set_epoch(epoch - 1)
                self.epoch = epoch
                metrics = self._train_epoch(loader, steps_per_epoch, target)
                if val_data is not None and not self._stop_requested:
                    val = self.evaluate(val_data)
                    metrics.update({f"val_{key}": value for key, value in val.items()})
                hooks.neuroflow_epoch_end(trainer=self, epoch=self.epoch, metrics=metrics)
                self.history.append(metrics)
                if self.checkpoint_every is not None and self._epoch_complete:
                    self.save_checkpoint(loader)  # again, now with the epoch's metrics in the history
                if self.progress:
                    print_epoch_metrics(self.epoch, target, metrics)
                if self._stop_requested:
                    self.history.interrupted = True
                    break
        finally:
            self._restore_interrupt_handler(previous_handler)
            hooks.neuroflow_train_end(trainer=self, history=self.history)
        return self.history

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, loader: Any = None) -> Any:
        """Write model, optimizer, scheduler, RNG states, step and data position to ``checkpoint_dir`` atomically."""
        from neuroflow.checkpoint.training import save_training_checkpoint

        if self.checkpoint_dir is None:
            raise ConfigError("save_checkpoint needs Trainer(checkpoint_dir=...)")
        return save_training_checkpoint(self, self.checkpoint_dir, self.keep_checkpoints, loader=loader)

    def resume(self, checkpoint: str | os.PathLike[str] | None = None) -> Any:
        """Restore the newest checkpoint in ``checkpoint`` (a directory or file; default ``checkpoint_dir``).

        The next ``fit(data, epochs=E)`` then finishes the interrupted run
        of E epochs from the step it stopped at; on cpu the result is bit
        for bit what an uninterrupted run gives.
        """
        from neuroflow.checkpoint.training import load_training_checkpoint

        source = checkpoint if checkpoint is not None else self.checkpoint_dir
        if source is None:
            raise ConfigError("resume needs a checkpoint directory or file")
        self._ensure_ready()
        info = load_training_checkpoint(self, source)
        self._resume_data = info.data
        self._resumed = True
        return info

    def _train_epoch(self, loader: Any, steps: int, epochs: int) -> dict[str, float]:
        start = time.perf_counter()
        bar = EpochProgress(self.epoch, epochs, steps, enabled=self.progress)
        k = self.gradient_accumulation_steps
        loss_sum, correct, seen = 0.0, 0, 0
        window: list[tuple[Any, Any]] = []
        batches = iter(loader)
        self._epoch_complete = False
        try:
            for x, y in batches:
                window.append((x if self.augment is None else self.augment(x), y))
                if len(window) < k:
                    continue
                loss, hits = self._optimisation_step(window)
                n = sum(len(b[0]) for b in window)
                loss_sum, correct, seen = loss_sum + loss * n, correct + hits, seen + n
                window = []
                bar.update(loss)
                if self.checkpoint_every is not None and self.step % self.checkpoint_every == 0:
                    self.save_checkpoint(loader)
                if self._stop_requested:
                    break
            else:
                self._epoch_complete = not window
            if window and not self._stop_requested:
                loss, hits = self._optimisation_step(window)
                n = sum(len(b[0]) for b in window)
                loss_sum, correct, seen = loss_sum + loss * n, correct + hits, seen + n
                bar.update(loss)
                if self.checkpoint_every is not None and self.step % self.checkpoint_every == 0:
                    self.save_checkpoint(loader)
                self._epoch_complete = True
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            bar.close()
        metrics: dict[str, float] = {"epoch": self.epoch, "loss": loss_sum / seen if seen else math.nan}
        if self._classification:
            metrics["accuracy"] = correct / max(seen, 1)
        if self.scheduler is not None:
            metrics["lr"] = float(self.scheduler.lr(max(self.step - 1, 0)))
        metrics["time_s"] = time.perf_counter() - start
        return metrics

    def evaluate(self, data: Any) -> dict[str, float]:
        """Mean loss (and accuracy for classification) over ``data`` in eval mode."""
        loader = self._loader(data, shuffle=False)
        backend = self.backend
        loss_sum, correct, seen = 0.0, 0, 0
        with self._inference() as model:
            for x, y in loader:
                xd, yd = backend.from_host(x), backend.from_host(y)
                out = model.forward(xd)
                loss_sum += self.loss.forward(out, yd) * len(x)
                if self._classification:
                    # the logits are small ((batch, classes)): counting on the host costs one read, no launches
                    correct += int((backend.to_host(out).argmax(axis=1) == y).sum())
                seen += len(x)
        if seen == 0:
            raise ConfigError("evaluate got no data")
        metrics = {"loss": loss_sum / seen}
        if self._classification:
            metrics["accuracy"] = correct / seen
        return metrics

    def predict(self, x: Any) -> np.ndarray:
        """Model outputs for host array ``x`` as a host array (class probabilities for CrossEntropy)."""
        x = np.asarray(x)
        backend = self.backend
        parts = []
        with self._inference() as model:
            for start in range(0, len(x), self.batch_size):
                out = model.forward(backend.from_host(x[start:start + self.batch_size]))
                parts.append(np.array(backend.to_host(self.loss.predictions(out)), copy=True))
        if not parts:
            raise ConfigError("predict got an empty batch")
        return np.concatenate(parts)

    @contextlib.contextmanager
    def _inference(self) -> Iterator[Operator]:
        """The model on the backend, loaded, in eval mode and on the trainer's buffers; its mode restored after."""
        self._place_model()
        model = self.model
        if self.offload is not None:
            self.offload.ensure_loaded()
        was_training = model.training
        model.eval()
        try:
            with self._buffers_lent():
                yield model
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------ plumbing
    def _loader(self, data: Any, shuffle: bool) -> Any:
        from neuroflow.data import DataLoader, as_dataset

        if isinstance(data, DataLoader):
            return data
        return DataLoader(as_dataset(data), batch_size=self.batch_size, shuffle=shuffle, seed=self.seed)

    @staticmethod
    def _sample_shape_of(data: Any) -> tuple[int, ...]:
        from neuroflow.data import as_dataset

        dataset = getattr(data, "dataset", None) or as_dataset(data)
        x, _ = dataset[np.arange(1)]
        return tuple(x.shape[1:])

    @staticmethod
    def _hooks() -> Any:
        from neuroflow.plugins import plugin_manager

        return plugin_manager().hook

    def request_stop(self) -> None:
        """Ask ``fit`` to stop after the current step (what Ctrl-C does)."""
        self._stop_requested = True

    def _install_interrupt_handler(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_interrupt(signum: int, frame: Any) -> None:
            if self._stop_requested:  # a second Ctrl-C aborts at once
                raise KeyboardInterrupt
            self._stop_requested = True

        return signal.signal(signal.SIGINT, on_interrupt)

    @staticmethod
    def _restore_interrupt_handler(previous: Any) -> None:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)

