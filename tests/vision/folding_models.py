"""Shared by the folding tests (vision and opencl): a convolution net whose every BatchNorm2d folds, and a spy on
the forward calls of ops."""

from __future__ import annotations

from typing import Any

import numpy as np

import neuroflow as nf
from neuroflow import ops
from neuroflow_ops_vision import BatchNorm2d, Conv2d, DepthwiseConv2d, SeparableConv2d


def randomised(bn: BatchNorm2d, rng: np.random.Generator) -> BatchNorm2d:
    c = bn.num_features
    bn.weight.data[...] = rng.uniform(0.5, 1.5, c)
    bn.bias.data[...] = rng.standard_normal(c)
    if bn.track_running_stats:
        bn.running_mean.data[...] = rng.standard_normal(c)
        bn.running_var.data[...] = rng.uniform(0.5, 2.0, c)
    return bn


def convnet(layout: str, rng: np.random.Generator, bias: bool = False, track: bool = True) -> nf.Sequential:
    """Every producer that folds, each followed by a BatchNorm2d (with and without a ReLU), as a user writes them."""
    nf.manual_seed(0)
    kw: dict[str, Any] = dict(layout=layout)
    model = nf.Sequential(
        Conv2d(3, 8, 3, padding=1, bias=bias, **kw), BatchNorm2d(8, track_running_stats=track, **kw), ops.ReLU(),
        SeparableConv2d(8, 16, 3, stride=2, padding=1, bias=bias, **kw), BatchNorm2d(16, activation="relu", **kw),
        DepthwiseConv2d(16, 3, padding=1, bias=bias, **kw), BatchNorm2d(16, **kw),
        Conv2d(16, 16, 3, padding=2, dilation=2, groups=4, bias=bias, **kw), BatchNorm2d(16, **kw), ops.ReLU(),
        ops.Flatten(), ops.Linear(16 * 8 * 8, 5),
    )
    for layer in model.layers:
        if isinstance(layer, BatchNorm2d):
            randomised(layer, rng)
    return model


class CallCounter:
    """Counts the forward calls of ``ops`` (as instance attributes: the ops' classes stay untouched)."""

    def __init__(self, ops_: list[Any]) -> None:
        self.calls = 0
        for op in ops_:
            original = op.forward

            def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.calls += 1
                return _original(*args, **kwargs)

            object.__setattr__(op, "forward", counted)


def norms(model: nf.Sequential) -> list[BatchNorm2d]:
    return [m for m in model.modules() if isinstance(m, BatchNorm2d)]
