"""The core's data-parallel part without MPI: options, max_steps, sharded loaders, the communicator lookup and a
one-rank communicator that records what the Trainer asks of it (tests/distributed runs real ranks)."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.config.schema import config_keys
from neuroflow.data import DataLoader
from neuroflow.data.loader import shard_bounds
from neuroflow.errors import ConfigError, UnknownNameError
from neuroflow.trainer.communicator import requested_communicator


def _mlp():
    nf.manual_seed(0)
    return nf.Sequential(ops.Linear(6, 16), ops.Tanh(), ops.Linear(16, 3))


def _blobs(n=60):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    return (rng.standard_normal((n, 6)) + y[:, None]).astype(np.float32), y


# ---------------------------------------------------------------------------------------------- max_steps
def test_max_steps_ends_fit_mid_epoch_and_decides_the_number_of_epochs():
    x, y = _blobs(60)  # 6 steps an epoch at batch 10
    short = nf.Trainer(_mlp(), batch_size=10, progress=False, seed=0, max_steps=4)
    history = short.fit((x, y), epochs=3)
    assert short.step == 4 and len(history) == 1 and not history.interrupted
    long = nf.Trainer(_mlp(), batch_size=10, progress=False, seed=0, max_steps=15)
    history = long.fit((x, y), epochs=1)  # max_steps asks for more than one epoch: it wins
    assert long.step == 15 and len(history) == 3


def test_max_steps_is_a_config_key_and_is_checked():
    keys = config_keys()
    assert keys["max_steps"] is int and keys["distributed"] is str and keys["bucket_mb"] is float
    assert keys["sync_batchnorm"] is bool
    with pytest.raises(ConfigError, match="max_steps must be a positive integer"):
        nf.Trainer(_mlp(), max_steps=0)
    with pytest.raises(ConfigError, match="bucket_mb must be a positive finite number"):
        nf.Trainer(_mlp(), bucket_mb=-1.0)


# ---------------------------------------------------------------------------------------------- sharded loaders
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_the_shards_of_every_batch_are_disjoint_and_make_up_the_batch_of_one_process(ranks):
    data = (np.arange(23, dtype=np.float32)[:, None], np.arange(23))
    whole = [y for _, y in DataLoader(data, batch_size=5, shuffle=True, seed=4)]
    shards = []
    for rank in range(ranks):
        loader = DataLoader(data, batch_size=5, shuffle=True, seed=4)
        loader.set_shard(rank, ranks)
        shards.append([y for _, y in loader])
        assert len(loader) == len(shards[-1])
    for b, batch in enumerate(whole[:len(shards[0])]):
        parts = [shards[rank][b] for rank in range(ranks)]
        np.testing.assert_array_equal(np.concatenate(parts), batch)  # in order: rank 0's rows first
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # the last batch (3 samples) is shared by up to 3 ranks; with more ranks than samples it would be left out
    assert len(shards[0]) == len(whole)


def test_a_final_batch_smaller_than_the_ranks_is_left_out_and_bad_shards_are_refused():
    loader = DataLoader((np.zeros((21, 1), np.float32), np.zeros(21)), batch_size=5)
    loader.set_shard(1, 2)
    assert len(loader) == 4 and [len(y) for _, y in loader] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="0 <= rank < ranks"):
        loader.set_shard(2, 2)
    with pytest.raises(ValueError, match="cannot be shared by 6 ranks"):
        loader.set_shard(0, 6)
    assert [shard_bounds(7, r, 3) for r in range(3)] == [(0, 3), (3, 5), (5, 7)]


def test_an_evaluation_shard_serves_the_short_last_batch_so_every_row_is_scored():
    data = (np.arange(21, dtype=np.float32).reshape(21, 1), np.arange(21))
    rows = []
    for rank in range(2):
        loader = DataLoader(data, batch_size=5)
        loader.set_shard(rank, 2, short_last=True)
        batches = [y for _, y in loader]
        assert len(loader) == len(batches) == 5
        rows.append(batches)
    assert [len(y) for y in rows[0]] == [3, 3, 3, 3, 1] and [len(y) for y in rows[1]] == [2, 2, 2, 2, 0]
    np.testing.assert_array_equal(np.sort(np.concatenate(rows[0] + rows[1])), np.arange(21))


# ---------------------------------------------------------------------------------------------- the communicator
def test_auto_reads_the_launcher_environment(monkeypatch):
    for variable in ("NEUROFLOW_DISTRIBUTED", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    assert requested_communicator(None) is None and requested_communicator("mpi") == "mpi"
    assert requested_communicator("auto") is None  # plain python: one process
    monkeypatch.setenv("PMI_SIZE", "1")
    assert requested_communicator("auto") is None
    monkeypatch.setenv("PMI_SIZE", "2")
    assert requested_communicator("auto") == "mpi"
    monkeypatch.setenv("NEUROFLOW_DISTRIBUTED", "nccl")
    assert requested_communicator("auto") == "nccl"


def test_an_unknown_communicator_lists_the_installed_ones_and_a_missing_one_says_what_to_install(monkeypatch):
    with pytest.raises(UnknownNameError, match="unknown communicator 'carrier-pigeon'; available"):
        nf.Trainer(_mlp(), distributed="carrier-pigeon")
    monkeypatch.setenv("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry.communicators.reset()
    try:
        with pytest.raises(UnknownNameError, match="pip install neuroflow-distributed"):
            nf.Trainer(_mlp(), distributed="mpi")
    finally:
        monkeypatch.delenv("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD")
        registry.communicators.reset()


class Reducer:
    def __init__(self, log):
        self.log = log

    def begin(self):
        self.log.append("begin")

    def ready(self, index):
        self.log.append(index)

    def finish(self):
        self.log.append("finish")


class OneRank:
    """A communicator of one rank that does nothing but record what the Trainer asks of it."""

    rank, size = 0, 1

    def __init__(self):
        self.log = []

    def broadcast(self, array, root=0):
        self.log.append(("broadcast", array.size))

    def allreduce_sum(self, array):
        pass

    def start_allreduce_sum(self, array):
        raise AssertionError("the reducer starts the allreduces")

    start_allreduce_mean = start_allreduce_sum

    def allreduce_scalars(self, values, op="sum", what="the step's sums"):
        return list(values)

    def sparse_allreduce_sum(self, array):
        return False

    def gradient_buckets(self, grad, slices, bucket_bytes):
        self.log.append(("buckets", len(slices), bucket_bytes))
        return Reducer(self.log)

    def barrier(self):
        pass

    def abort(self, code, message):
        raise AssertionError(message)

    def close(self):
        pass


def _registered(name, communicator):
    """Register ``communicator`` (a class) as communicator ``name`` for one test; yield the instances it made."""
    made = []

    def factory():
        made.append(communicator())
        return made[-1]

    registry.communicators.register(name, factory)
    yield made
    registry.communicators.unregister(name)


@pytest.fixture
def one_rank():
    yield from _registered("one-rank", OneRank)


def test_each_parameter_is_announced_once_as_its_op_finishes_backward_on_the_last_micro_batch(one_rank):
    x, y = _blobs(24)
    plain = nf.Trainer(_mlp(), batch_size=12, progress=False, seed=0, gradient_accumulation_steps=2)
    parallel = nf.Trainer(_mlp(), batch_size=12, progress=False, seed=0, gradient_accumulation_steps=2,
                          distributed="one-rank", bucket_mb=1.0)
    for _ in range(2):
        plain.train_step(x, y)
        parallel.train_step(x, y)
    np.testing.assert_array_equal(parallel.flat_parameters.data, plain.flat_parameters.data)
    log = one_rank[0].log
    assert log[0] == ("broadcast", parallel.flat_parameters.size)  # rank 0's parameters, before the first step
    assert ("buckets", 4, 2**20) in log
    steps = log[log.index(("buckets", 4, 2**20)) + 1:]
    # per step: begin before the last micro-batch's backward, the second Linear's weight and bias, then the first's
    assert steps == ["begin", 2, 3, 0, 1, "finish"] * 2


def test_update_in_backward_is_refused_in_a_data_parallel_run(one_rank):
    with pytest.raises(ConfigError, match="cannot be combined with distributed='one-rank'"):
        nf.Trainer(_mlp(), distributed="one-rank", update_in_backward=True)


def test_evaluate_adds_up_every_rank_s_sums(one_rank):
    x, y = _blobs(30)
    trainer = nf.Trainer(_mlp(), batch_size=10, progress=False, seed=0, distributed="one-rank")
    alone = nf.Trainer(_mlp(), batch_size=10, progress=False, seed=0)
    assert trainer.evaluate((x, y)) == alone.evaluate((x, y))
    assert trainer.is_root and trainer.parallel.size == 1


# ---------------------------------------------------------------------------------------------- sums, timing
class Mirrored(OneRank):
    """Rank 0 of two whose other rank sends ``other`` (None: the same values as this one) to every scalar sum."""

    rank, size = 0, 2

    def __init__(self, other=None):
        super().__init__()
        self.other = other

    def allreduce_scalars(self, values, op="sum", what="the step's sums"):
        self.log.append(what)
        other = values if self.other is None else self.other + [0.0] * (len(values) - len(self.other))
        return [a + b for a, b in zip(values, other, strict=False)]


def test_the_sums_over_ranks_say_what_they_are_and_a_rank_in_another_collective_is_an_error():
    from neuroflow.trainer.data_parallel import CollectiveMismatchError, DataParallel

    same = DataParallel(Mirrored())
    assert same.global_rows(5) == 10 and same.reduce_sums([1.0, 2.0]) == [2.0, 4.0]
    assert same.communicator.log == ["the rows of the step's global batch", "the sums of Trainer.evaluate"]
    evaluating = DataParallel(Mirrored(other=[3.0, 9.0]))  # the other rank is in Trainer.evaluate's sums
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 was in the rows of the step's global batch while "
                                                      r"another of the 2 ranks was in a different collective.*"
                                                      r"call it on every rank"):
        evaluating.global_rows(5)
    training = DataParallel(Mirrored(other=[2.0, 4.0]))  # the other rank finishes a step
    with pytest.raises(CollectiveMismatchError, match="rank 0 was in the sums of Trainer.evaluate"):
        training.reduce_sums([1.0, 2.0, 3.0])


def test_the_step_timing_tells_the_wait_for_a_slower_rank_from_the_exposed_communication():
    from neuroflow.trainer.data_parallel import DataParallel, StepTiming

    # rank 0 reached the wait at 10.0 and left at 10.5; rank 1 got there at 10.4: 0.4 s waiting, 0.1 s exposed
    timing = StepTiming.of(10.0, 10.5, [10.0, 10.4], 3)
    assert timing.slowest == 1 and timing.started_early == 3
    assert timing.waited_s == pytest.approx(0.4) and timing.exposed_s == pytest.approx(0.1)
    late = StepTiming.of(10.4, 10.5, [10.0, 10.4], 3)  # the slowest rank waits for nobody
    assert late.waited_s == 0.0 and late.exposed_s == pytest.approx(0.1) and late.slowest == 1
    parallel = DataParallel(Mirrored())
    assert parallel.timing is None
    parallel.reduce_step(1.0, 2)  # the step's sums carry each rank's arrival: no collective of their own
    assert parallel.timing is not None and parallel.communicator.log == ["the step's loss sum and stop flag"]


def test_train_step_on_the_global_batch_needs_one_scalar_sum_a_step_and_a_sharded_loader_two():
    made = []

    def factory():
        made.append(Mirrored())  # rank 0 of two whose other rank does the same
        return made[-1]

    registry.communicators.register("mirrored", factory)
    try:
        x, y = _blobs(40)
        trainer = nf.Trainer(_mlp(), batch_size=10, progress=False, seed=0, distributed="mirrored")
        trainer.train_step(x[:10], y[:10])
        trainer.train_step(x[10:21], y[10:21])  # 11 rows: rank 0 takes 6; the global rows are known here
        sums = [entry for entry in made[0].log if isinstance(entry, str) and entry.startswith("the ")]
        assert sums == ["the step's loss sum and stop flag"] * 2
        made[0].log.clear()
        trainer.fit((x, y), epochs=1)  # the loader cuts the shards: each step asks for the global rows
        sums = [entry for entry in made[0].log if isinstance(entry, str) and entry.startswith("the ")]
        assert sums == ["the rows of the step's global batch", "the step's loss sum and stop flag"] * 4
    finally:
        registry.communicators.unregister("mirrored")


# ---------------------------------------------------------------------------------------------- sync_batchnorm
@pytest.fixture
def mirrored():
    yield from _registered("mirrored", Mirrored)


def _cnn_with_batchnorm():
    nf.manual_seed(0)
    vision = registry.ops
    return nf.Sequential(vision.get("Conv2d")(2, 4, 3, padding=1), vision.get("BatchNorm2d")(4), ops.ReLU(),
                         ops.Flatten(), ops.Linear(4 * 5 * 5, 3))


STATISTICS = "BatchNorm's batch statistics (sync_batchnorm)"


def test_sync_batchnorm_sums_each_batchnorm_s_statistics_over_the_ranks_in_forward_and_backward(mirrored):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 2, 5, 5)).astype(np.float32), rng.integers(0, 3, 8)
    model = _cnn_with_batchnorm()
    trainer = nf.Trainer(model, batch_size=8, progress=False, seed=0, distributed="mirrored", sync_batchnorm=True)
    trainer.train_step(x, y)
    log = mirrored[0].log
    assert log.count(STATISTICS) == 2  # one sum in forward, one in backward
    bn = next(m for m in model.modules() if m.normalises_over_batch)
    assert bn.cross_rank_sum is not None
    with trainer.parallel.alone():  # a forward the other ranks do not run asks them nothing
        assert bn.cross_rank_sum is None
        model.forward(trainer.backend.from_host(x[:4]))
    assert bn.cross_rank_sum is not None and log.count(STATISTICS) == 2
    trainer.parallel.release()
    assert bn.cross_rank_sum is None


def test_sync_batchnorm_off_or_eval_asks_the_other_ranks_nothing(mirrored):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 2, 5, 5)).astype(np.float32), rng.integers(0, 3, 8)
    trainer = nf.Trainer(_cnn_with_batchnorm(), batch_size=8, progress=False, seed=0, distributed="mirrored")
    trainer.train_step(x, y)
    synced = nf.Trainer(_cnn_with_batchnorm(), batch_size=8, progress=False, seed=0, distributed="mirrored",
                        sync_batchnorm=True)
    synced.train_step(x, y)
    synced.predict(x)  # eval mode: the running statistics, on this rank alone
    assert STATISTICS not in mirrored[0].log and mirrored[1].log.count(STATISTICS) == 2


def test_sync_batchnorm_on_a_model_without_batchnorm_says_there_is_nothing_to_synchronise(mirrored):
    x, y = _blobs(8)
    trainer = nf.Trainer(_mlp(), batch_size=8, progress=False, seed=0, distributed="mirrored", sync_batchnorm=True)
    with pytest.warns(UserWarning, match="no op of Sequential normalises over the batch"):
        trainer.train_step(x, y)
