"""Gradient buckets: their plan, and when each bucket's allreduce starts (with a recording communicator)."""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow_distributed.buckets import BucketPlan, GradientBuckets
from neuroflow_distributed.communicator import CommunicatorError


def slices_of(sizes):
    out, offset = [], 0
    for size in sizes:
        out.append(slice(offset, offset + size))
        offset += size
    return out


def test_buckets_cover_the_buffer_in_reverse_parameter_order_without_splitting_a_parameter():
    sizes = [100, 3, 40, 2, 10, 1]
    plan = BucketPlan.reverse_order(slices_of(sizes), 4, 12 * 4)
    assert plan.ranges == ((143, 156), (103, 143), (0, 103))  # from the end: (10+1 -> +2 = 13), (40), (3+100)
    assert plan.bucket_of == (2, 2, 1, 0, 0, 0)
    assert plan.members == (3, 1, 2)
    covered = sorted(plan.ranges)
    assert covered[0][0] == 0 and covered[-1][1] == sum(sizes)
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


def test_a_bucket_larger_than_everything_is_one_bucket_and_bad_sizes_are_refused():
    assert BucketPlan.reverse_order(slices_of([5, 5]), 4, 2**30).ranges == ((0, 10),)
    with pytest.raises(CommunicatorError, match="at least one byte"):
        BucketPlan.reverse_order(slices_of([5]), 4, 0)
    with pytest.raises(CommunicatorError, match="no parameters"):
        BucketPlan.reverse_order([], 4, 16)


class Doubling:
    """A handle whose wait doubles its array: every element summed over two identical ranks."""

    def __init__(self, array):
        self.array = array

    def done(self):
        return False

    def wait(self):
        self.array *= 2


class Recorder:
    """A communicator of one rank that records the sizes of the arrays it was asked to sum."""

    def __init__(self):
        self.started = []

    def start_allreduce_sum(self, array):
        self.started.append((array.base is not None, len(array)))
        return Doubling(array)


def test_a_bucket_starts_when_its_last_parameter_is_final_and_finish_sums_every_bucket():
    grad = np.ones(156, dtype=np.float32)
    comm = Recorder()
    buckets = GradientBuckets(comm, grad, slices_of([100, 3, 40, 2, 10, 1]), 12 * 4)
    buckets.begin()
    buckets.ready(5)
    buckets.ready(4)
    assert comm.started == []  # parameter 3 of the first bucket is not final yet
    buckets.ready(3)
    assert [n for _, n in comm.started] == [13]
    buckets.ready(2)
    assert [n for _, n in comm.started] == [13, 40]
    assert buckets.started_early == 2
    buckets.finish()  # parameters 0 and 1 said nothing: their bucket starts here
    assert [n for _, n in comm.started] == [13, 40, 103]
    np.testing.assert_array_equal(grad, 2)  # every element went through exactly one bucket
    with pytest.raises(CommunicatorError, match="without begin"):
        buckets.finish()


def test_ready_outside_a_step_or_without_overlap_starts_nothing():
    comm = Recorder()
    buckets = GradientBuckets(comm, np.zeros(4, np.float32), slices_of([2, 2]), 8)
    buckets.ready(1)  # not begun: an accumulation micro-batch before the last
    assert comm.started == []
    buckets.overlap = False
    buckets.begin()
    buckets.ready(1)
    buckets.ready(0)
    assert comm.started == [] and buckets.started_early == 0
    buckets.finish()
    assert len(comm.started) == 2
