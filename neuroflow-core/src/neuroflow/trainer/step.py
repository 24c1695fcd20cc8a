"""One optimisation step: forward, loss and backward of each micro-batch on the session's buffers, then the update."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow import debug
from neuroflow.data.loader import shard_bounds
from neuroflow.errors import NonFiniteDataError, NonFiniteLossError
from neuroflow.losses.cross_entropy import CrossEntropy
from neuroflow.operator import structure_generation
from neuroflow.optim.clip import clip_grad_norm
from neuroflow.replay import Recording, StepReplay
from neuroflow.trainer.data_parallel import DataParallel
from neuroflow.trainer.session import MemorySession

#: Where a step's key (``OptimisationStep._key``) holds the pool, and where the batch's shapes and types start.
_POOL, _SHAPES = 4, 10
#: Replays held at once, one per batch shape: the full batch and an epoch's last, short one (and a few more).
_MOST_REPLAYS = 4


def _settings(loss: Any) -> Any:
    """A loss's settings as its ``get_config`` gives them (a replay recorded with others is not used)."""
    get_config = getattr(loss, "get_config", None)
    return None if get_config is None else get_config()


class OptimisationStep:
    """Runs steps for a session and counts them; ``count`` is the number of steps taken (what checkpoints save).

    ``on_step_end(step, loss)`` is called after each step (the trainer
    passes its plugins' ``neuroflow_step_end`` hook through it). With
    ``parallel``, the micro-batches are this rank's rows of the global ones
    and the gradients are summed over ranks before the update.
    """

    def __init__(self, session: MemorySession, scheduler: Any, clip: float | None, update_in_backward: bool,
                 on_step_end: Callable[[int, float], None], parallel: DataParallel | None = None,
                 replay: bool = True) -> None:
        self.session = session
        self.parallel = parallel
        self.scheduler = scheduler
        self.clip = clip
        self.update_in_backward = update_in_backward
        self.on_step_end = on_step_end
        self.classification = isinstance(session.loss, CrossEntropy)
        self.count = 0
        self.last_grad_norm: float | None = None
        #: the rows the last step trained on (all ranks' in a data-parallel run)
        self.last_rows = 0
        #: whether a steady-state step may be recorded and replayed (:mod:`neuroflow.replay`)
        self.replay_steps = replay
        #: the replays held, by the batch's shapes and types (a few: the full batch, an epoch's short last one)
        self.replays: dict[tuple[Any, ...], StepReplay] = {}
        self._last_pool: Any = None  # the pool the last step ran on: a step on the same one is steady
        self._refused: tuple[Any, ...] | None = None  # the key of the last step whose ops could not be recorded
        self._recording_now: Recording | None = None

    def split(self, x: Any, y: Any) -> list[tuple[Any, Any]]:
        """Host arrays ``x``, ``y`` as the micro-batches of one step (their gradients add up to the batch's); with
        ``parallel``, ``x``, ``y`` are the global batch and the micro-batches this rank's rows of its parts."""
        k = min(self.session.accumulation, len(x))
        parts = [(x, y)] if k == 1 else list(zip(np.array_split(x, k), np.array_split(y, k)))
        return parts if self.parallel is None else [self.parallel.shard(bx, by) for bx, by in parts]

    def run(self, micro_batches: list[tuple[Any, Any]], count_correct: bool = True) -> tuple[float, int]:
        """One step over ``micro_batches``; the mean loss and, for classification when ``count_correct`` (``fit``
        reports accuracy, ``train_step`` does not), the correct predictions, else 0."""
        session = self.session
        if self.replays and len(micro_batches) == 1:
            replayed = self._replayed(session, *micro_batches[0], count_correct and self.classification)
            if replayed is not None:
                return replayed
        with session.lend():
            try:
                return self._run(session, micro_batches, count_correct and self.classification)
            finally:
                if self._recording_now is not None:  # the step is over, whether it was recorded or failed
                    self._recording_now.stop()
                    self._recording_now = None

    def _key(self, x: Any, y: Any) -> tuple[Any, ...]:
        """What a replay depends on beyond its arrays: the model's structure and packing, the pool, the arrays'
        shapes and types, the features that change a step (each checked when the step is recorded)."""
        session = self.session
        return (structure_generation(), session.model, session.loss, _settings(session.loss), session.pool,
                session.flat, session.streamed, session.offload, session.compressor, debug.enabled(),
                x.shape, x.dtype, y.shape, y.dtype)

    @property
    def replay(self) -> StepReplay | None:
        """The replay recorded last, or None."""
        return next(reversed(self.replays.values()), None)

    def _replayed(self, session: MemorySession, x: Any, y: Any, counting: bool) -> tuple[float, int] | None:
        """The step as the replay of its shapes, when nothing it depends on changed (else None: the ops run it, and
        replays whose model, packing or plan changed are dropped); None too when the loss is not finite or a label
        is out of range, so that the ops run the step again and say what is wrong."""
        with session.lock:
            flat = session.ready()
            if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
                return None
            key = self._key(x, y)
            replay = self.replays.get(key[_SHAPES:])
            if replay is None or key != replay.key or not replay.still():
                if replay is not None or key[:_SHAPES] != next(iter(self.replays.values())).key[:_SHAPES]:
                    self.replays.clear()  # what they were made of changed
                return None
            model = session.model
            if not model.training:
                model.train()
            session.prepare_step(flat, tuple(x.shape[1:]), len(x))
            if session.pool is not replay.key[_POOL]:  # planned anew
                self.replays.clear()
                return None
            lr = self.scheduler.lr(self.count) if self.scheduler is not None else None
            value = replay.forward(x, y)
            if value is None:
                return None
            correct = int((replay.output.argmax(axis=1) == y).sum()) if counting else 0
            replay.backward()
            return self._update(session, flat, lr, value * len(x), correct, len(x))

    def _run(self, session: MemorySession, micro_batches: list[tuple[Any, Any]], counting: bool) -> tuple[float, int]:
        model, loss_fn, backend = session.model, session.loss, session.backend
        flat = session.ready()
        if not model.training:
            model.train()
        total = sum(len(x) for x, _ in micro_batches)
        largest = max(len(x) for x, _ in micro_batches)
        parallel = self.parallel
        if parallel is not None:  # every loss scaled by its rows over the global batch's: the sum over ranks is the mean
            parallel.prepare(model, flat, session.compressor is not None)
            total = parallel.global_rows(total)
        session.prepare_step(flat, tuple(micro_batches[0][0].shape[1:]), largest)
        streamed = session.streamed
        lr = self.scheduler.lr(self.count) if self.scheduler is not None else None
        loss_sum = 0.0
        correct = 0
        ordered = sorted(micro_batches, key=lambda b: -len(b[0]))
        recording = self._recording(micro_batches)
        pool, self._last_pool = session.pool, session.pool
        for x, y in ordered:
            tracer = session.start_trace(tuple(x.shape[1:]))
            xd, yd = backend.from_host(x), backend.from_host(y)
            if recording is not None:
                recording.start(xd, yd, pool)
            out = model.forward(xd)
            # the logits are small ((batch, classes)): counted on the host, their copy started before the loss
            # so that the loss's read back is the only wait
            logits = backend.start_to_host(out) if counting else None
            value = loss_fn.forward(out, yd)
            if not math.isfinite(value):
                raise self.nonfinite_loss(value, micro_batches, x, y, xd, total)
            if recording is not None:
                recording.model(model, xd, out).loss(loss_fn, out, yd)
            if logits is not None:
                correct += int((logits().argmax(axis=1) == y).sum())
            if streamed is not None:  # one micro-batch: the step is counted once its loss is known to be finite
                streamed.begin(lr)
            if parallel is not None and x is ordered[-1][0]:
                parallel.begin_backward()  # the step's last backward: its final gradients go out as they come
            g = loss_fn.backward(scale=len(x) / total)
            if recording is not None:
                recording.loss_backward(loss_fn, len(x) / total, g)
            gx = model.backward(g)
            if recording is not None:
                self._recorded(recording, model, g, gx, out, x, y)
            if tracer is not None:
                tracer.handoff(g, gx, model)
                tracer.release(gx)
                tracer.done(loss_fn)
                session.finish_trace(tracer, len(x))
                # The traced arrays are views of one reservation: any one left alive keeps all its pages resident
                # through the optimizer step, whose first call allocates the optimizer's state.
                xd = yd = out = g = gx = logits = None
            loss_sum += value * len(x)
        return self._update(session, flat, lr, loss_sum, correct, total)

    def _recording(self, micro_batches: list[tuple[Any, Any]]) -> Recording | None:
        """A recording of this step when it may become the replay: replays allowed and none held, one micro-batch
        on numpy arrays, the same planned pool as the last step (a steady step), none of the features that change
        a step per call, and not the key of a step already refused."""
        session = self.session
        if not self.replay_steps or len(micro_batches) != 1 or self.parallel is not None:
            return None
        x, y = micro_batches[0]
        pool = session.pool
        if (pool is None or pool is not self._last_pool or pool.tracing or session.backend.xp is not np
                or not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray)):
            return None
        key = self._key(x, y)
        if key[_SHAPES:] in self.replays or len(self.replays) >= _MOST_REPLAYS:
            return None
        streamed, offload, compressor, checks = key[_SHAPES - 4:_SHAPES]
        if key == self._refused or streamed is not None or offload is not None or compressor is not None or checks:
            return None
        recording = self._recording_now = Recording(key)
        return recording

    def _recorded(self, recording: Recording, model: Any, g: Any, gx: Any, out: Any, x: Any, y: Any) -> None:
        """After the recorded step's backward: the replay, or the key that was refused."""
        recording.backward(model, g, gx)
        recording.stop()
        replay = recording.finish(out)
        if replay is None or self._key(x, y) != recording.key:
            self._refused = recording.key
        else:
            self.replays[recording.key[_SHAPES:]] = replay

    def _update(self, session: MemorySession, flat: Any, lr: float | None, loss_sum: float, correct: int,
                total: int) -> tuple[float, int]:
        """The step after its backward: reduce or compress the gradients, clip, update, count; the mean loss and
        the correct predictions."""
        streamed = session.streamed
        parallel = self.parallel
        model = session.model
        if streamed is not None:
            streamed.update_kept()
        else:
            if session.compressor is not None:
                session.compressor.compress(flat.grad)  # the optimizer (and clipping) see only what is sent
            if parallel is not None:
                parallel.reduce_gradients()  # clipping then sees the global norm
            if self.clip is not None:
                self.last_grad_norm = clip_grad_norm(flat.grad, self.clip)
            session.optimizer.step(lr)
            if self.update_in_backward:
                session.start_streaming()
        if session.offload is not None:
            session.offload.after_step()
        self.count += 1
        if parallel is not None:
            loss_sum, correct = parallel.reduce_step(loss_sum, correct)
            parallel.after_step(model, self.count)
        self.last_rows = total
        mean_loss = loss_sum / total
        self.on_step_end(self.count, mean_loss)
        return mean_loss, correct

    def nonfinite_loss(self, value: float, micro_batches: list[tuple[Any, Any]], x: Any, y: Any,
                       xd: Any, total: int) -> NonFiniteLossError:
        """The error for a non-finite loss: the batch's data when it holds NaN/Inf, else the first layer to blame.

        The data are checked here, once the loss is not finite, rather than before every forward: the hot
        path pays nothing, and non-finite data matter when they make the loss non-finite, which is when they
        are found and named here, before any layer is blamed.
        """
        index = next(i for i, (xi, _) in enumerate(micro_batches) if xi is x)
        for which, host in (("inputs", x), ("targets", y)):
            host = np.asarray(host)
            if host.dtype.kind not in "fc":
                continue
            bad = ~np.isfinite(host).reshape(len(host), -1)
            if bad.any():
                where, first = self.share_of(micro_batches, index, total)
                rows = [first + int(r) for r in np.flatnonzero(bad.any(axis=1))]
                return NonFiniteDataError(self.count + 1, value, which, index, len(micro_batches), rows,
                                          int(bad.sum()), where)
        return NonFiniteLossError(self.count + 1, value, self.first_nonfinite_layer(xd))

    def share_of(self, micro_batches: list[tuple[Any, Any]], index: int, total: int) -> tuple[str | None, int]:
        """For an error that names rows of micro-batch ``index``: the batch to name them in (None: the one the
        step was given) and the row of it where this process's rows start. A data-parallel rank's one micro-batch
        is a run of the step's ``total`` global rows, named in the global batch; several are its share of each."""
        parallel = self.parallel
        if parallel is None or parallel.size == 1:
            return None, 0
        if len(micro_batches) == 1:
            start = shard_bounds(total, parallel.rank, parallel.size)[0]
            return f"the global batch (rank {parallel.rank} of {parallel.size} holds them)", start
        return f"rank {parallel.rank}'s share of micro-batch {index} of {len(micro_batches)}", 0

    def first_nonfinite_layer(self, x: Any) -> str | None:
        """Re-run the forward layer by layer to name the first layer whose output is not finite."""
        model = self.session.model
        xp = self.session.backend.xp
        layers = getattr(model, "layers", None)
        if not layers:
            return None
        h = x
        # the other ranks do not run this forward: no op may wait for their statistics
        with contextlib.nullcontext() if self.parallel is None else self.parallel.alone():
            for i, layer in enumerate(layers):
                h = layer.forward(h)
                if not bool(xp.isfinite(h).all()):
                    return f"{i} ({layer!r})"
        return None
