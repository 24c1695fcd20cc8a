"""DataParallel: the Trainer's part in a data-parallel run, one process per rank, the same model on each.

What makes N ranks × a global batch B train exactly as one process with
batch B:

* the parameters (and buffers, BatchNorm's running statistics) start as rank
  0's: :meth:`DataParallel.prepare` broadcasts them before the first step;
* every rank takes its own disjoint rows of each global batch (the
  DataLoader's shard, :meth:`neuroflow.data.DataLoader.set_shard`), so the
  sequence of global batches does not depend on N;
* each rank scales its loss by its rows over the step's global rows
  (:meth:`global_rows`): the sum over ranks of the gradients is then the
  gradient of the global mean, however unevenly the rows were shared;
* that sum is taken in buckets during the step's last backward, each
  bucket's allreduce starting as soon as all its parameters' gradients are
  final (:meth:`begin_backward` makes each parameter's owning op say so when
  its backward returns), and waited for before clipping and the optimizer,
  which then run the same update on the same values on every rank. With
  gradient compression each rank compresses its own gradient after backward
  and only the entries kept are exchanged;
* with ``sync_batchnorm``, every op that normalises over the batch
  (:attr:`~neuroflow.operator.Operator.normalises_over_batch`: BatchNorm)
  sums its per-channel statistics over the ranks in forward and backward
  (:attr:`~neuroflow.operator.Operator.cross_rank_sum`), so it normalises
  with the global batch's statistics as one process would.

Only rank 0 prints and writes files (:attr:`is_root`); every rank takes part
in every collective, so a rank may not skip a step: a fault on one ends the
run on all (:meth:`guard`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroflow.buffers.flat import FlatParameters
from neuroflow.data.loader import shard_bounds
from neuroflow.errors import ConfigError, NeuroFlowError
from neuroflow.operator import Operator
from neuroflow.trainer.communicator import Communicator, GradientReducer, open_communicator, requested_communicator

#: The bucket size when ``bucket_mb`` is not set, measured with ``benchmarks/distributed.py --models resnet18
#: --bucket-mb 1 2 4 8 25`` (ResNet-18, batch 32 a rank, 2 ranks at one thread each, MPICH over shared memory; the
#: engine's timers, :attr:`DataParallel.timing`): the share of the allreduce hidden behind backward was 93 % at
#: 1 MiB, 94 % at 2 and at 4, 66 % at 8 and 59 % at 25 MiB (PyTorch DDP's default): larger buckets start too late,
#: smaller ones pay more per-message costs.
DEFAULT_BUCKET_MB = 2.0


class ParametersDivergedError(NeuroFlowError, RuntimeError):
    """``debug=True`` found ranks whose parameters differ after a step."""


class CollectiveMismatchError(NeuroFlowError, RuntimeError):
    """The ranks were in different collectives: one evaluating while another trained, say."""


#: DataParallel's sums over ranks, and what each is (named when the ranks are not all in the same one)
_ROWS, _STEP, _EVALUATE = 1.0, 2.0, 3.0
_SUMS = {_ROWS: "the rows of the step's global batch", _STEP: "the step's loss sum and stop flag",
         _EVALUATE: "the sums of Trainer.evaluate"}


@dataclass(frozen=True)
class StepTiming:
    """Where one step's wait for the summed gradient went, on this rank (:attr:`DataParallel.timing`).

    ``waited_s`` is the time spent waiting for the slowest rank to finish
    its backward (``slowest`` is that rank): a rank that is late, not
    communication. ``exposed_s`` is the communication left once every rank
    had finished backward: what backward did not hide. ``started_early`` is
    the number of buckets whose allreduce started during backward. The
    ranks' moments are compared on the wall clock (``time.time``): exact
    for the processes of one host; across hosts as good as the hosts'
    clocks agree (NTP: about a millisecond).
    """

    exposed_s: float
    waited_s: float
    slowest: int
    started_early: int

    @classmethod
    def of(cls, arrived: float, left: float, arrivals: list[float], early: int) -> StepTiming:
        """This rank's timing: it ``arrived`` at the wait and ``left`` it; ``arrivals[r]`` is when rank r arrived."""
        last = max(arrivals)
        return cls(exposed_s=max(0.0, left - max(last, arrived)), waited_s=min(left - arrived, max(0.0, last - arrived)),
                   slowest=int(arrivals.index(last)), started_early=early)


class DataParallel:
    """The data-parallel side of one Trainer: its communicator, its gradient buckets and the checks around them."""

    def __init__(self, communicator: Communicator, bucket_mb: float | None = None, debug: bool = False,
                 sync_batchnorm: bool = False) -> None:
        self.communicator = communicator
        self.rank = int(communicator.rank)
        self.size = int(communicator.size)
        self.bucket_bytes = max(1, int((bucket_mb if bucket_mb is not None else DEFAULT_BUCKET_MB) * 2**20))
        self.debug = debug
        self.sync_batchnorm = sync_batchnorm
        self.flat: FlatParameters | None = None
        self.reducer: GradientReducer | None = None
        self.compressing = False
        #: True during the step's last backward: the ops then announce their final gradients to the reducer
        self.announcing = False
        #: whether the last compressed gradient went out as its nonzero entries (else dense)
        self.sent_sparse = False
        #: the trainer's Interruption (``requested``, ``agreed``): a stop asked for on any rank (Ctrl-C) is agreed
        #: on at the end of each step, so that every rank stops after the same one
        self.stop: Any = None
        self._hooked: list[Operator] = []
        self._synchronised: list[Operator] = []  # the ops given cross_rank_sum (sync_batchnorm)
        #: where the last step's gradient exchange spent its time (None before the first data-parallel step)
        self.timing: StepTiming | None = None
        self._arrived = self._reduced = 0.0  # when this rank reached the gradient wait, and left it
        self._early = 0
        self._global_rows = 0  # the rows of the global micro-batches shard cut since the last step began

    @classmethod
    def from_options(cls, options: Any, stop: Any = None) -> DataParallel | None:
        """The DataParallel ``options.distributed`` asks for ("mpi", "nccl", "auto"); None to train alone.
        ``stop`` is the trainer's Interruption (see :attr:`stop`)."""
        name = requested_communicator(options.distributed)
        if name is None:
            return None
        if options.update_in_backward:
            raise ConfigError("update_in_backward applies each update inside backward, before the other ranks' "
                              f"gradients are summed; it cannot be combined with distributed={options.distributed!r}")
        parallel = cls(open_communicator(name), options.bucket_mb, options.debug, options.sync_batchnorm)
        parallel.stop = stop
        return parallel

    def __repr__(self) -> str:
        return f"DataParallel(rank={self.rank}, size={self.size}, bucket_bytes={self.bucket_bytes})"

    @property
    def is_root(self) -> bool:
        """Whether this rank prints progress and writes checkpoints and model files (rank 0)."""
        return self.rank == 0

    # ------------------------------------------------------------------ the start of each step
    def prepare(self, model: Operator, flat: FlatParameters, compressing: bool) -> None:
        """Before a step on ``flat``: the first time (or when the model was packed anew), make every rank's
        parameters and buffers rank 0's and plan the gradient buckets over ``flat.grad``."""
        if flat is self.flat:
            return
        self.release()
        comm = self.communicator
        comm.broadcast(flat.data, 0)
        packed = {id(p) for p in flat.params}
        for tensor in [p for p in model.parameters() if id(p) not in packed] + [t for _, t in model.named_buffers()]:
            comm.broadcast(tensor.data, 0)
        self.flat, self.compressing = flat, compressing
        self.reducer = comm.gradient_buckets(flat.grad, flat.slices, self.bucket_bytes)
        if not compressing:  # a compressed gradient exists only once backward is over: nothing to send before
            self._announce_final_gradients(model, flat)
        if self.sync_batchnorm and self.size > 1:
            self._synchronise_batch_statistics(model)

    def global_rows(self, rows: int) -> int:
        """The rows of this step's global batch: the sum of every rank's ``rows`` (each loss is scaled by it).

        When this step's micro-batches were cut here (:meth:`shard`: ``train_step`` on the global batch) their
        global rows are known without asking the other ranks; a sharded loader's batches cost one allreduce.
        """
        known, self._global_rows = self._global_rows, 0
        if self.size == 1:
            return rows
        if known:
            return known
        return int(round(self._sums(_ROWS, [float(rows)])[0]))

    def begin_backward(self) -> None:
        """Before the step's last backward: from now on each final gradient joins its bucket's allreduce."""
        if self.reducer is not None and not self.compressing:
            self.reducer.begin()
            self.announcing = True

    def reduce_gradients(self) -> None:
        """After backward (and compression): wait until ``flat.grad`` holds the sum over ranks."""
        reducer, flat = self.reducer, self.flat
        if reducer is None or flat is None:
            raise ConfigError("DataParallel.reduce_gradients before prepare")
        self.announcing = False
        self._arrived = time.time()  # the wall clock: compared across ranks (and hosts)
        if self.compressing:  # only the entries the compressor kept go out (when that is fewer bytes)
            self.sent_sparse = self.communicator.sparse_allreduce_sum(flat.grad)
            self._early = 0
        else:
            reducer.finish()
            self._early = int(getattr(reducer, "started_early", 0))
        self._reduced = time.time()

    def reduce_step(self, loss_sum: float, correct: int) -> tuple[float, int]:
        """The step's loss sum and correct predictions over all ranks; a stop asked for on any rank, on all.

        The same one allreduce carries each rank's arrival at the gradient
        wait (in its own slot), from which :attr:`timing` is worked out: no
        collective of its own.
        """
        asked = self.stop is not None and self.stop.requested
        if self.size > 1:
            arrivals = [0.0] * self.size
            arrivals[self.rank] = self._arrived
            loss_sum, hits, stop, *arrivals = self._sums(_STEP, [loss_sum, float(correct), float(asked), *arrivals])
            correct, asked = int(round(hits)), stop > 0
            self.timing = StepTiming.of(self._arrived, self._reduced, arrivals, self._early)
        if self.stop is not None:
            self.stop.agreed = asked
        return loss_sum, correct

    def after_step(self, model: Operator, step: int) -> None:
        """After the update: the ranks' parameters compared (``debug``). (With ``sync_batchnorm`` the running
        statistics need nothing here: every rank updated them from the same global batch statistics.)"""
        if self.debug and self.flat is not None:
            self.check_identical(step)

    def check_identical(self, step: int) -> None:
        """Raise ParametersDivergedError on every rank when any two ranks' parameters differ in a single bit."""
        flat = self.flat
        if flat is None or self.size == 1:
            return
        host = flat.data if isinstance(flat.data, np.ndarray) else flat.data.get()
        checksum = float(zlib.crc32(np.ascontiguousarray(host).data))
        high, negated_low = self.communicator.allreduce_scalars([checksum, -checksum], op="max",
                                                                what="the parameters' checksums (debug=True)")
        low = -negated_low  # one collective for both ends
        if high != low:
            raise ParametersDivergedError(f"after step {step} the parameters differ between ranks (checksums from "
                                          f"{int(low):#010x} to {int(high):#010x}); rank {self.rank} has "
                                          f"{int(checksum):#010x}. Every rank must run the same model, optimizer "
                                          f"and step (a nondeterministic op, or a rank that skipped a collective)")

    # ------------------------------------------------------------------ sharding, evaluation, faults
    def shard(self, x: Any, y: Any) -> tuple[Any, Any]:
        """This rank's rows of a global batch ``x``, ``y`` (the same cut the DataLoader's shard makes)."""
        if self.size == 1:
            return x, y
        if len(x) < self.size:
            raise ConfigError(f"a global batch of {len(x)} rows cannot be shared by {self.size} ranks; "
                              f"give each rank at least one row")
        start, stop = shard_bounds(len(x), self.rank, self.size)
        self._global_rows += len(x)  # this step's global rows, for global_rows
        return x[start:stop], y[start:stop]

    def reduce_sums(self, values: list[float]) -> list[float]:
        """``values`` summed over ranks (evaluation's loss sum, correct predictions and samples): a collective,
        which every rank must call (``Trainer.evaluate`` on one rank alone is a CollectiveMismatchError when the
        others go on training; once they have finished, the run ends after the collective timeout, or within seconds
        where the ranks share a run directory, as under ``neuroflow train --nproc``)."""
        return values if self.size == 1 else self._sums(_EVALUATE, values)

    def _sums(self, kind: float, values: list[float]) -> list[float]:
        """``values`` summed over ranks, with ``kind`` (which of :data:`_SUMS` this is) and its square in front:
        every rank in the same one leaves them ``size`` times their own, and any two kinds that differ do not
        (a sum of squares equal to ``size`` times the square of the mean means no spread), so that a rank that
        called another collective is an error here instead of numbers silently added to the wrong ones."""
        total, squares, *sums = self.communicator.allreduce_scalars([kind, kind * kind, *values], what=_SUMS[kind])
        if total != self.size * kind or squares != self.size * kind * kind:
            hint = (" Trainer.evaluate sums over every rank: call it on every rank, with the same data (predict "
                    "needs no other rank)" if kind == _EVALUATE or total > self.size * kind else "")
            raise CollectiveMismatchError(f"rank {self.rank} was in {_SUMS[kind]} while another of the {self.size} "
                                          f"ranks was in a different collective: every rank must run the same "
                                          f"steps and calls.{hint}")
        return sums

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """An exception inside ends every rank (MPI Abort), so that no other rank is left waiting in a collective."""
        try:
            yield
        except Exception as error:
            if self.size == 1:
                raise
            self.communicator.abort(1, f"{type(error).__name__}: {error}")
            raise

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Inside, the ops that normalise over the batch use this rank's rows only: for a forward that the
        other ranks do not run (looking for the layer that made one rank's loss non-finite)."""
        self._lend_statistics_sum(False)
        try:
            yield
        finally:
            self._lend_statistics_sum(True)

    def release(self) -> None:
        """Undo :meth:`prepare`'s notifications (before the model is packed anew, or when the trainer is done)."""
        for module in self._hooked:
            vars(module).pop("backward", None)
        self._lend_statistics_sum(False)
        self._hooked = []
        self._synchronised = []
        self.flat = self.reducer = None
        self.announcing = False

    def close(self) -> None:
        self.release()
        self.communicator.close()

    # ------------------------------------------------------------------ synchronised batch statistics
    def _synchronise_batch_statistics(self, model: Operator) -> None:
        """Give every op of ``model`` that normalises over the batch the sum over ranks (``sync_batchnorm``)."""
        self._synchronised = [m for m in model.modules() if m.normalises_over_batch]
        if not self._synchronised:
            warnings.warn(f"sync_batchnorm=True, but no op of {type(model).__name__} normalises over the batch "
                          f"(BatchNorm): nothing to synchronise", stacklevel=2)
        self._lend_statistics_sum(True)

    def _lend_statistics_sum(self, lend: bool) -> None:
        """Give the synchronised ops :meth:`_sum_statistics` as their ``cross_rank_sum``, or take it back."""
        for module in self._synchronised:
            if lend:
                module.cross_rank_sum = self._sum_statistics
            else:
                vars(module).pop("cross_rank_sum", None)

    def _sum_statistics(self, partial: np.ndarray) -> np.ndarray:
        """``partial`` (one op's per-channel sums on this rank) summed over the ranks."""
        return np.asarray(self.communicator.allreduce_scalars(
            partial.tolist(), what="BatchNorm's batch statistics (sync_batchnorm)"), dtype=np.float64)

    # ------------------------------------------------------------------ when a gradient is final
    def _announce_final_gradients(self, model: Operator, flat: FlatParameters) -> None:
        """Make the op that owns each parameter report it to the reducer when its backward returns.

        The op whose own (not its children's) parameter it is writes or adds
        its gradient in its backward; once that returns, the gradient of this
        micro-batch is complete. This holds when every op runs once per
        backward and owns its parameters alone: with a layer used twice, or a
        parameter shared by two ops, nothing is announced and every bucket
        starts after backward (the same sums, without the overlap). An op
        that never runs a backward of its own (its parent computes its
        gradient) is caught the same way: its bucket starts in ``finish``.
        """
        modules = list(model.modules())
        if len(modules) != len({id(m) for m in modules}):
            return
        index = {id(p): i for i, p in enumerate(flat.params)}
        owned: dict[int, list[int]] = {}
        owners: dict[int, int] = {}
        for module in modules:
            inherited = {id(p) for child in module.children() for p in child.parameters()}
            for p in module.parameters():
                if id(p) in inherited or id(p) not in index:
                    continue
                if id(p) in owners:
                    return  # a parameter two ops own
                owners[id(p)] = id(module)
                owned.setdefault(id(module), []).append(index[id(p)])
        reducer = self.reducer
        for module in modules:
            indices = owned.get(id(module))
            if indices and reducer is not None:
                self._announce_after_backward(module, reducer, tuple(indices))

    def _announce_after_backward(self, module: Operator, reducer: GradientReducer, indices: tuple[int, ...]) -> None:
        # An instance attribute in front of the class's backward: no op needs to know about data parallelism.
        backward = module.backward

        def announcing_backward(*args: Any, **kwargs: Any) -> Any:
            result = backward(*args, **kwargs)
            if self.announcing:
                for i in indices:
                    reducer.ready(i)
            return result

        object.__setattr__(module, "backward", announcing_backward)
        self._hooked.append(module)



def guard(parallel: DataParallel | None) -> contextlib.AbstractContextManager[None]:
    """:meth:`DataParallel.guard` in a data-parallel run; nothing when the process trains alone."""
    return contextlib.nullcontext() if parallel is None else parallel.guard()
