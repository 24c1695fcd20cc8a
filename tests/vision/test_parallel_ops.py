"""Vision ops split over threads (neuroflow.backends.cpu_parallel) give what they give inline, bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from neuroflow import ops
from neuroflow.backends import cpu_parallel
from neuroflow.testing import gradcheck
from neuroflow_ops_vision import AvgPool2d, BatchNorm2d, Conv2d, DepthwiseConv2d, MaxPool2d, SeparableConv2d


def _run(make: Callable[[], Any], x: np.ndarray, threads: int) -> list[bytes]:
    cpu_parallel.set_threads(threads)
    try:
        op = make()
        op.train()
        y = op.forward(x)
        g = np.random.default_rng(1).standard_normal(y.shape).astype(y.dtype)
        gx = op.backward(g)
        grads = [p.grad.tobytes() for _, p in op.named_parameters() if p.grad is not None]
        return [np.ascontiguousarray(y).tobytes(), np.ascontiguousarray(gx).tobytes(), *grads]
    finally:
        cpu_parallel.set_threads(None)


def _seeded(factory: Callable[[], Any]) -> Callable[[], Any]:
    def make() -> Any:
        import neuroflow as nf

        nf.manual_seed(0)
        return factory()
    return make


CASES = {
    "depthwise_s1": (lambda: DepthwiseConv2d(32, 3, padding=1, layout="NHWC"), (9, 24, 24, 32)),
    "depthwise_s2_m2": (lambda: DepthwiseConv2d(16, 3, stride=2, padding=1, depth_multiplier=2, layout="NHWC"),
                        (5, 33, 33, 16)),
    "separable_nchw": (lambda: SeparableConv2d(16, 24, 3, padding=1), (6, 16, 30, 30)),
    "batchnorm_relu_nhwc": (lambda: BatchNorm2d(32, activation="relu", layout="NHWC"), (7, 24, 24, 32)),
    "batchnorm_nchw": (lambda: BatchNorm2d(16), (7, 16, 33, 33)),
    "maxpool_relu": (lambda: MaxPool2d(2, activation="relu", layout="NHWC"), (9, 32, 32, 32)),
    "maxpool_overlap": (lambda: MaxPool2d(3, stride=2, padding=1), (5, 16, 33, 33)),
    "avgpool": (lambda: AvgPool2d(3, stride=2, padding=1, layout="NHWC"), (5, 33, 33, 16)),
    "conv3x3": (lambda: Conv2d(8, 16, 3, padding=1), (9, 8, 32, 32)),
    "relu": (lambda: ops.ReLU(), (9, 32, 32, 32)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_over_threads_equals_inline(name: str, every_size_splits: None) -> None:
    factory, shape = CASES[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    inline = _run(_seeded(factory), x, 1)
    split = _run(_seeded(factory), x, 2)
    assert len(split) == len(inline) >= 2
    assert split == inline


SMALL = {"depthwise_s2_m2": (3, 7, 7, 16), "batchnorm_relu_nhwc": (3, 5, 5, 32), "maxpool_overlap": (3, 16, 7, 7),
         "avgpool": (3, 7, 7, 16), "relu": (3, 4, 5, 6)}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_gradcheck_on_the_split_path(name: str, monkeypatch: pytest.MonkeyPatch, every_size_splits: None) -> None:
    # every size takes the threaded path here, small enough for a float64 gradient check
    monkeypatch.setattr(cpu_parallel, "CACHE_BLOCK_BYTES", 64)  # several cache blocks per chunk as well
    cpu_parallel.set_threads(2)
    try:
        x = np.random.default_rng(2).standard_normal(SMALL[name])
        op = CASES[name][0]()
        gradcheck(op, x)
    finally:
        cpu_parallel.set_threads(None)
