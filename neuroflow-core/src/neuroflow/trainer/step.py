"""One optimisation step: forward, loss and backward of each micro-batch on the session's buffers, then the update."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow.data.loader import shard_bounds
from neuroflow.errors import NonFiniteDataError, NonFiniteLossError
from neuroflow.losses.cross_entropy import CrossEntropy
from neuroflow.optim.clip import clip_grad_norm
from neuroflow.trainer.data_parallel import DataParallel
from neuroflow.trainer.session import MemorySession


class OptimisationStep:
    """Runs steps for a session and counts them; ``count`` is the number of steps taken (what checkpoints save).

    ``on_step_end(step, loss)`` is called after each step (the trainer
    passes its plugins' ``neuroflow_step_end`` hook through it). With
    ``parallel``, the micro-batches are this rank's rows of the global ones
    and the gradients are summed over ranks before the update.
    """

    def __init__(self, session: MemorySession, scheduler: Any, clip: float | None, update_in_backward: bool,
                 on_step_end: Callable[[int, float], None], parallel: DataParallel | None = None) -> None:
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

    def split(self, x: Any, y: Any) -> list[tuple[Any, Any]]:
        """Host arrays ``x``, ``y`` as the micro-batches of one step (their gradients add up to the batch's); with
        ``parallel``, ``x``, ``y`` are the global batch and the micro-batches this rank's rows of its parts."""
        k = min(self.session.accumulation, len(x))
        parts = [(x, y)] if k == 1 else list(zip(np.array_split(x, k), np.array_split(y, k)))
        return parts if self.parallel is None else [self.parallel.shard(bx, by) for bx, by in parts]

    def run(self, micro_batches: list[tuple[Any, Any]]) -> tuple[float, int]:
        """One step over ``micro_batches``; the mean loss and, for classification, the correct predictions."""
        session = self.session
        with session.lend():
            return self._run(session, micro_batches)

    def _run(self, session: MemorySession, micro_batches: list[tuple[Any, Any]]) -> tuple[float, int]:
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
        for x, y in ordered:
            tracer = session.start_trace(tuple(x.shape[1:]))
            xd, yd = backend.from_host(x), backend.from_host(y)
            out = model.forward(xd)
            # the logits are small ((batch, classes)): counted on the host, their copy started before the loss
            # so that the loss's read back is the only wait
            logits = backend.start_to_host(out) if self.classification else None
            value = loss_fn.forward(out, yd)
            if not math.isfinite(value):
                raise self.nonfinite_loss(value, micro_batches, x, y, xd, total)
            if logits is not None:
                correct += int((logits().argmax(axis=1) == y).sum())
            if streamed is not None:  # one micro-batch: the step is counted once its loss is known to be finite
                streamed.begin(lr)
            if parallel is not None and x is ordered[-1][0]:
                parallel.begin_backward()  # the step's last backward: its final gradients go out as they come
            g = loss_fn.backward(scale=len(x) / total)
            gx = model.backward(g)
            if tracer is not None:
                tracer.handoff(g, gx, model)
                tracer.release(gx)
                tracer.done(loss_fn)
                session.finish_trace(tracer, len(x))
                # The traced arrays are views of one reservation: any one left alive keeps all its pages resident
                # through the optimizer step, whose first call allocates the optimizer's state.
                xd = yd = out = g = gx = logits = None
            loss_sum += value * len(x)
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
