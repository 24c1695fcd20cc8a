"""BatchNorm2d with ``cross_rank_sum`` (``sync_batchnorm``): ranks that each hold some rows of a batch normalise
as one op over the whole batch. The ranks here are threads summing through a barrier; the MPI runs are in
tests/distributed/test_training.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow_ops_vision import BatchNorm2d


class ThreadRanks:
    """``size`` threads as ranks: each rank's :meth:`sum_for` function returns the sum over all ranks' vectors,
    added in rank order (the same total on every rank), as an allreduce would."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=20)
        self.parts: dict[int, np.ndarray] = {}
        self.calls = [0] * size

    def sum_for(self, rank: int) -> Callable[[np.ndarray], np.ndarray]:
        def total(vector: np.ndarray) -> np.ndarray:
            self.calls[rank] += 1
            self.parts[rank] = vector.copy()
            self.barrier.wait()
            result = sum(self.parts[r] for r in range(self.size))
            self.barrier.wait()  # nobody writes the next call's part before every rank has read this one
            return np.asarray(result)
        return total

    def run(self, work: Callable[[int], Any]) -> list[Any]:
        """``work(rank)`` on every rank at once; its results in rank order (an exception in any is raised)."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def one(rank: int) -> None:
            try:
                results[rank] = work(rank)
            except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if errors:
            raise errors[0]
        return results


def _batchnorm(layout: str, activation: str | None, c: int, seed: int = 3) -> BatchNorm2d:
    rng = np.random.default_rng(seed)
    bn = BatchNorm2d(c, layout=layout, activation=activation, dtype=np.float64)
    bn.weight.data[...] = rng.uniform(0.5, 1.5, c)
    bn.bias.data[...] = rng.standard_normal(c)
    return bn


def _rows(layout: str, n: int, c: int, seed: int, shift: float = 0.5) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, c, 4, 5)) * 2.0 + shift
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "NHWC" else x


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("cut", [(5, 3), (1, 4, 3)], ids=["two-ranks-uneven", "three-ranks-one-row"])
def test_ranks_with_a_share_of_the_rows_normalise_as_one_op_over_the_whole_batch(layout, activation, cut):
    c = 6
    x = _rows(layout, sum(cut), c, seed=1)
    g = _rows(layout, sum(cut), c, seed=2, shift=0.0)
    whole = _batchnorm(layout, activation, c)
    y_whole = whole.forward(x).copy()
    gx_whole = whole.backward(g).copy()

    ranks = ThreadRanks(len(cut))
    bounds = np.cumsum((0, *cut))
    replicas = [_batchnorm(layout, activation, c) for _ in cut]

    def step(rank: int) -> tuple[np.ndarray, np.ndarray]:
        bn, rows = replicas[rank], slice(bounds[rank], bounds[rank + 1])
        bn.cross_rank_sum = ranks.sum_for(rank)
        y = bn.forward(np.ascontiguousarray(x[rows])).copy()
        return y, bn.backward(np.ascontiguousarray(g[rows])).copy()

    results = ranks.run(step)
    np.testing.assert_allclose(np.concatenate([y for y, _ in results]), y_whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([gx for _, gx in results]), gx_whole, rtol=1e-10, atol=1e-12)
    # each rank's parameter gradient is its rows' share: the gradient exchange adds them up to the whole's
    for name in ("weight", "bias"):
        shares = sum(getattr(bn, name).grad for bn in replicas)
        np.testing.assert_allclose(shares, getattr(whole, name).grad, rtol=1e-11, atol=1e-12)
    for bn in replicas:  # the running statistics come from the global batch: the same on every rank
        np.testing.assert_allclose(bn.running_mean.data, whole.running_mean.data, rtol=1e-13)
        np.testing.assert_allclose(bn.running_var.data, whole.running_var.data, rtol=1e-13)
    assert ranks.calls == [2] * len(cut)  # one allreduce in forward, one in backward


def test_a_channel_whose_mean_dwarfs_its_spread_takes_the_second_pass_on_every_rank_alike():
    c = 3
    x = _rows("NCHW", 6, c, seed=4, shift=0.0) * 1e-3 + 1e3  # var ≪ 1e-2·mean²: the centred two-pass variance
    whole = _batchnorm("NCHW", None, c)
    y_whole = whole.forward(x).copy()
    ranks = ThreadRanks(2)
    replicas = [_batchnorm("NCHW", None, c) for _ in range(2)]

    def forward(rank: int) -> np.ndarray:
        replicas[rank].cross_rank_sum = ranks.sum_for(rank)
        return replicas[rank].forward(x[rank * 3:(rank + 1) * 3].copy()).copy()

    y = np.concatenate(ranks.run(forward))
    np.testing.assert_allclose(y, y_whole, rtol=1e-9, atol=1e-9)
    assert ranks.calls == [2, 2]  # the sums, then the centred squares


def test_eval_and_inference_never_wait_for_other_ranks():
    bn = _batchnorm("NCHW", None, 4)

    def refuse(vector: np.ndarray) -> np.ndarray:
        raise AssertionError("an eval forward asked the other ranks")

    bn.cross_rank_sum = refuse
    bn.eval()
    x = _rows("NCHW", 3, 4, seed=5)
    y = bn.forward(x)
    bn.backward(np.ones_like(y))  # eval backward: the running statistics, no exchange


def test_one_value_per_channel_is_enough_on_a_rank_when_the_ranks_hold_more_in_all():
    ranks = ThreadRanks(2)
    replicas = [_batchnorm("NCHW", None, 2) for _ in range(2)]
    x = np.random.default_rng(6).standard_normal((2, 2, 1, 1))

    def forward(rank: int) -> np.ndarray:
        replicas[rank].cross_rank_sum = ranks.sum_for(rank)
        return replicas[rank].forward(x[rank:rank + 1].copy()).copy()

    y = np.concatenate(ranks.run(forward))
    np.testing.assert_allclose(y, _batchnorm("NCHW", None, 2).forward(x), rtol=1e-12)


def test_one_value_per_channel_over_all_ranks_is_refused():
    bn = _batchnorm("NCHW", None, 2)
    bn.cross_rank_sum = lambda vector: vector  # a run of one rank
    with pytest.raises(ShapeError, match="more than one value per channel over all ranks"):
        bn.forward(np.ones((1, 2, 1, 1)))


def test_a_sum_of_the_wrong_length_is_refused():
    bn = _batchnorm("NCHW", None, 2)
    bn.cross_rank_sum = lambda vector: vector[:-1]
    with pytest.raises(ShapeError, match="cross_rank_sum returned shape"):
        bn.forward(np.ones((3, 2, 2, 2)))
