"""Gradient buckets: the flat gradient cut into contiguous slices, each allreduced as soon as all of it is final.

Backward finishes the parameters roughly in reverse order (the last layer's
first), so the buckets are taken from the end of the flat buffer: the first
bucket fills, and starts its allreduce, while backward still runs through
the layers before it (PyTorch DDP's reverse-order buckets; Horovod's tensor
fusion). The plan is made once per flat buffer: the bucket views and the
per-bucket counters are kept, so a steady-state step allocates no array.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroflow_distributed.communicator import CommunicatorError


@dataclass(frozen=True)
class BucketPlan:
    """Which parameters go in which bucket: ``ranges[b]`` is bucket b's ``(start, stop)`` in the flat buffer,
    ``bucket_of[i]`` the bucket of parameter i, ``members[b]`` how many parameters bucket b holds."""

    ranges: tuple[tuple[int, int], ...]
    bucket_of: tuple[int, ...]
    members: tuple[int, ...]

    @classmethod
    def reverse_order(cls, slices: list[slice], itemsize: int, bucket_bytes: int) -> BucketPlan:
        """Buckets of at least ``bucket_bytes`` (the last one may be smaller) filled from the last parameter back.

        A parameter is never split: one larger than ``bucket_bytes`` is a bucket of its own.
        """
        if bucket_bytes < 1:
            raise CommunicatorError(f"bucket size must be at least one byte; got {bucket_bytes}")
        if not slices:
            raise CommunicatorError("no parameters to make buckets of")
        ranges: list[tuple[int, int]] = []
        bucket_of = [0] * len(slices)
        members: list[int] = []
        stop = filled = count = 0
        for index in reversed(range(len(slices))):
            view = slices[index]
            if count == 0:
                stop = view.stop
            bucket_of[index] = len(ranges)
            count += 1
            filled += (view.stop - view.start) * itemsize
            if filled >= bucket_bytes or index == 0:
                ranges.append((view.start, stop))
                members.append(count)
                filled = count = 0
        return cls(tuple(ranges), tuple(bucket_of), tuple(members))


class GradientBuckets:
    """A :class:`~neuroflow.trainer.communicator.GradientReducer` over ``grad`` with ``communicator``.

    :meth:`ready` counts a parameter of its bucket; the bucket's sum over
    ranks starts when the count is full. It also tests the buckets already
    started: MPI progresses a non-blocking collective only inside MPI calls,
    so these tests are what moves the data while backward computes.
    :meth:`finish` starts the buckets left (parameters that got no gradient
    this step, or whose op said nothing) and waits for all of them.
    """

    def __init__(self, communicator: Any, grad: Any, slices: list[slice], bucket_bytes: int) -> None:
        self.communicator = communicator
        self.grad = grad
        self.plan = BucketPlan.reverse_order(slices, int(grad.dtype.itemsize), bucket_bytes)
        self.views = [grad[start:stop] for start, stop in self.plan.ranges]
        self._members = np.asarray(self.plan.members, dtype=np.int64)
        self._pending = np.zeros_like(self._members)
        self._handles: list[Any] = [None] * len(self.views)
        self._next_to_test = 0
        self.active = False
        #: False: every bucket starts in :meth:`finish`, after backward (what the overlap is measured against)
        self.overlap = True
        #: buckets the last step started from :meth:`ready`, during backward (the rest started in :meth:`finish`)
        self.started_early = 0
        #: when the last :meth:`finish` began (``time.perf_counter()``, one clock for the processes of a host) and
        #: how long it took: the communication backward did not hide, and the wait for slower ranks
        self.finish_started = 0.0
        self.finish_seconds = 0.0

    def __len__(self) -> int:
        return len(self.views)

    def begin(self) -> None:
        """Count from zero: every bucket waits for all its parameters again."""
        np.copyto(self._pending, self._members)
        handles = self._handles
        for bucket in range(len(handles)):  # in place: a step allocates no list
            handles[bucket] = None
        self._next_to_test = 0
        self.active = True
        self.started_early = 0

    def ready(self, index: int) -> None:
        if not (self.active and self.overlap):
            return
        bucket = self.plan.bucket_of[index]
        self._pending[bucket] -= 1
        if self._pending[bucket] == 0:
            self._start(bucket)
            self.started_early += 1
        self._progress()

    def finish(self) -> None:
        """Start the buckets not started yet, then wait for every one: ``grad`` holds the sum over ranks."""
        if not self.active:
            raise CommunicatorError("GradientBuckets.finish() without begin()")
        start = self.finish_started = time.perf_counter()
        for bucket, handle in enumerate(self._handles):
            if handle is None:
                self._start(bucket)
        for handle in self._handles:
            handle.wait()
        self.active = False
        self.finish_seconds = time.perf_counter() - start

    def _start(self, bucket: int) -> None:
        self._handles[bucket] = self.communicator.start_allreduce_sum(self.views[bucket])

    def _progress(self) -> None:
        """Test the oldest started bucket not known to be done (one MPI call: cheap, and enough to move data)."""
        handles = self._handles
        while self._next_to_test < len(handles):
            handle = handles[self._next_to_test]
            if handle is None or not handle.done():
                return
            self._next_to_test += 1
