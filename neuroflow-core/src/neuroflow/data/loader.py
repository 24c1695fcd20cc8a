"""DataLoader: seeded, resumable mini-batches from a dataset, gathered ahead in a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from neuroflow.data.dataset import Dataset, as_dataset
from neuroflow.random import child_seed

Batch = tuple[np.ndarray, np.ndarray | None]

_DONE = object()
# How often a blocked worker looks at its stop flag; short enough that closing an iterator is prompt.
_POLL_S = 0.05


class _WorkerFailure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class DataLoader:
    """Mini-batches ``(x, y)`` of contiguous numpy arrays, reshuffled every epoch from one seed.

    Each ``iter()`` is one epoch. Epoch ``k`` is shuffled by a generator derived from ``(seed, k)``,
    so the order depends only on the seed and the epoch number, never on what ran before; this is
    what lets ``state_dict()``/``load_state_dict()`` resume a checkpoint in the middle of an epoch.

    >>> loader = DataLoader((x, y), batch_size=64, shuffle=True, seed=0)
    >>> for x_batch, y_batch in loader: ...
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 64,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int | None = None,
        prefetch: int = 2,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"DataLoader batch_size must be an integer >= 1; got {batch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int | np.integer) or prefetch < 0:
            raise ValueError(
                f"DataLoader prefetch must be an integer >= 0 (0 gathers batches in the caller); got {prefetch!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
            raise ValueError(f"DataLoader seed must be None or an integer >= 0; got {seed!r}")
        self.dataset: Dataset = as_dataset(dataset)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.prefetch = int(prefetch)
        # Drawn once, here, so every epoch of this loader (and a resumed one) shares it.
        self.seed = child_seed() if seed is None else int(seed)
        self._epoch = 0
        self._position = 0  # batches of self._epoch already handed to the consumer
        # True when the next iter() must run exactly (self._epoch, self._position): before the first
        # epoch and after set_epoch/load_state_dict. Otherwise iter() starts the following epoch.
        self._pinned = True
        self._generation = 0  # which iterator may update the position; older ones no longer do
        self.shard: tuple[int, int] = (0, 1)  # (rank, ranks): the rows of each batch this process gathers
        self._short_last = False  # set_shard(..., short_last=True): a last batch shorter than ranks is served too

    def __len__(self) -> int:
        """The number of batches in one full epoch."""
        n = len(self.dataset)
        if self.drop_last or (not self._short_last and 0 < n % self.batch_size < self.shard[1]):  # too short to share
            return n // self.batch_size
        return -(-n // self.batch_size)

    def set_shard(self, rank: int, ranks: int, short_last: bool = False) -> None:
        """Give this process (``rank`` of ``ranks``) only its rows of every batch: :func:`shard_bounds` of it.

        The batches (their order and their samples) stay those of one
        process, so training sees the same global batches for any number of
        ranks; a final batch with fewer samples than ranks is left out (a
        training step needs rows on every rank), unless ``short_last``: then
        it is served too, and the ranks past its rows get an empty batch (an
        evaluation, whose sums every rank adds once at the end, scores every
        sample).
        """
        for name, value in (("rank", rank), ("ranks", ranks)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"DataLoader.set_shard {name} must be an integer; got {value!r}")
        if ranks < 1 or not 0 <= rank < ranks:
            raise ValueError(f"DataLoader.set_shard needs 0 <= rank < ranks; got rank={rank}, ranks={ranks}")
        if ranks > self.batch_size:
            raise ValueError(f"a batch of {self.batch_size} samples cannot be shared by {ranks} ranks; "
                             f"use batch_size >= {ranks}")
        self.shard, self._short_last = (int(rank), int(ranks)), bool(short_last)

    def __repr__(self) -> str:
        return (
            f"DataLoader({len(self.dataset)} samples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, seed={self.seed}, prefetch={self.prefetch})"
        )

    @property
    def epoch(self) -> int:
        """The epoch being iterated (or the next one to run when none has started)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` from its first batch (its shuffle is fixed by the seed)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"DataLoader.set_epoch expects an integer >= 0; got {epoch!r}")
        self._epoch, self._position, self._pinned = int(epoch), 0, True

    def indices(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch``: a permutation derived from (seed, epoch), or 0..n-1 unshuffled."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(n).astype(np.int64, copy=False)

    def state_dict(self) -> dict[str, int]:
        """Where the consumer is in the data: the epoch and how many of its batches it has received."""
        epoch, position = self._epoch, self._position
        if position >= len(self) and not self._pinned:
            epoch, position = epoch + 1, 0  # a finished epoch: the checkpoint resumes at the next one
        return {
            "epoch": epoch, "position": position, "seed": self.seed,
            "batch_size": self.batch_size, "num_samples": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next ``iter()`` yield exactly the batches that remained when ``state`` was taken."""
        missing = [key for key in ("epoch", "position", "seed") if key not in state]
        if missing:
            raise ValueError(f"DataLoader state is missing {', '.join(missing)}; got keys {sorted(state)}")
        for key, here in (("batch_size", self.batch_size), ("num_samples", len(self.dataset))):
            if key in state and state[key] != here:
                raise ValueError(
                    f"DataLoader state was saved with {key}={state[key]} but this loader has {key}={here}; "
                    "resuming would give different batches"
                )
        epoch, position, seed = state["epoch"], state["position"], state["seed"]
        for key, value in (("epoch", epoch), ("position", position), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"DataLoader state {key} must be an integer >= 0; got {value!r}")
        if position > len(self):
            raise ValueError(f"DataLoader state position {position} is past the end of an epoch of {len(self)} batches")
        if position == len(self) > 0:  # saved at the end of an epoch: resume at the start of the next
            epoch, position = epoch + 1, 0
        self.seed, self._epoch, self._position, self._pinned = int(seed), int(epoch), int(position), True

    def __iter__(self) -> Iterator[Batch]:
        if not self._pinned:
            self._epoch, self._position = self._epoch + 1, 0
        self._pinned = False
        self._generation += 1
        order = self.indices(self._epoch)
        end = len(self) * self.batch_size  # drop_last leaves out the short final batch here
        starts = range(self._position * self.batch_size, end, self.batch_size)
        index_batches = [order[start:start + self.batch_size] for start in starts]
        rank, ranks = self.shard
        if ranks > 1:
            index_batches = [b[slice(*shard_bounds(len(b), rank, ranks))] for b in index_batches]
        if self.prefetch == 0:
            return self._serve_inline(index_batches, self._generation)
        return self._serve_prefetched(index_batches, self._generation)

    def _handed_out(self, generation: int) -> None:
        if generation == self._generation:
            self._position += 1

    def _serve_inline(self, index_batches: list[np.ndarray], generation: int) -> Iterator[Batch]:
        for idx in index_batches:
            batch = _gather(self.dataset, idx)
            self._handed_out(generation)
            yield batch
            del batch  # not kept while the next one is gathered: the consumer holds what it still needs

    def _serve_prefetched(self, index_batches: list[np.ndarray], generation: int) -> Iterator[Batch]:
        # The worker holds only the dataset, the index batches, the queue and the stop flag — never
        # this generator — so dropping the iterator runs the `finally` below, which stops the worker.
        ready: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        worker = threading.Thread(
            target=_prefetch, args=(self.dataset, index_batches, ready, stop),
            name="neuroflow-dataloader", daemon=True,
        )
        worker.start()
        try:
            while True:
                try:
                    item = ready.get(timeout=_POLL_S)
                except queue.Empty:
                    if not worker.is_alive() and ready.empty():
                        raise RuntimeError("DataLoader worker thread ended without finishing the epoch") from None
                    continue
                if item is _DONE:
                    return
                if isinstance(item, _WorkerFailure):
                    raise item.error
                self._handed_out(generation)
                yield item
                del item  # not kept while the next one is awaited: the worker may be gathering another meanwhile
        finally:
            stop.set()
            if worker is not threading.current_thread():  # the cyclic GC may finalise us on the worker
                worker.join()


def shard_bounds(rows: int, rank: int, ranks: int) -> tuple[int, int]:
    """Rank ``rank``'s ``(start, stop)`` among ``rows`` rows shared by ``ranks`` processes: contiguous, disjoint,
    the first ``rows % ranks`` ranks taking one row more (numpy's ``array_split``)."""
    base, extra = divmod(rows, ranks)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _gather(dataset: Dataset, idx: np.ndarray) -> Batch:
    """One batch from the dataset, as contiguous arrays the consumer may keep or modify."""
    batch = dataset[idx]
    if not isinstance(batch, tuple) or len(batch) != 2:
        raise TypeError(
            f"{type(dataset).__name__}[indices] returned {type(batch).__name__}; a DataLoader needs an (x, y) tuple"
        )
    x, y = batch
    return np.ascontiguousarray(x), None if y is None else np.ascontiguousarray(y)


def _prefetch(dataset: Dataset, index_batches: list[np.ndarray], ready: queue.Queue[Any], stop: threading.Event) -> None:
    """Worker thread: gather batches in order into ``ready`` until done, failed or told to stop."""
    try:
        for idx in index_batches:
            if stop.is_set() or not _put(ready, _gather(dataset, idx), stop):
                return
        _put(ready, _DONE, stop)
    except BaseException as error:  # handed to the consumer, which re-raises it in its own thread
        _put(ready, _WorkerFailure(error), stop)


def _put(ready: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Block until the bounded queue takes ``item``; False if told to stop first."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False
