"""float32 against float64 over long sequences: the bias gradients, sums over batch·time rows, keep float32's
digits (blocked sums of ``neuroflow.backends.reductions``; numpy's sum over those rows adds one after another).

Bound: pairwise summation of n terms errs by at most ⌈log₂ n⌉·u·Σ|xᵢ| (u = eps/2, first order); the tests
allow log2(n)·eps relative to the float64 gradient, n = batch·time = 131,072 rows.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from neuroflow import ops

EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize(("make", "params"), [
    (lambda: ops.GRU(2, 4, return_sequences=True), ("bias_ih_l0", "bias_hh_l0")),
    (lambda: ops.WaveletElman(2, 4, nonlinearity="morlet", return_sequences=True), ("bias_ih_l0", "translation", "dilation")),
], ids=["GRU", "WaveletElman"])
def test_bias_gradients_over_batch_and_time(make, params) -> None:
    rng = np.random.default_rng(0)
    batch, time = 4096, 32  # short sequences: the error of backpropagation through time stays small
    x = rng.standard_normal((batch, time, 2)).astype(np.float32)
    g = (rng.standard_normal((batch, time, 4)) * 0.1 + 1.0).astype(np.float32)  # a gradient with a mean
    layer = make()
    wide = copy.deepcopy(layer).astype(np.float64)
    grads = []
    for op, dtype in ((layer, np.float32), (wide, np.float64)):
        op.forward(x.astype(dtype))
        op.backward(g.astype(dtype))
        grads.append({p: np.asarray(getattr(op, p).grad, np.float64) for p in params})
    narrow, exact = grads
    for name in params:
        error = np.linalg.norm(narrow[name] - exact[name]) / np.linalg.norm(exact[name])
        assert error <= math.log2(batch * time) * EPS32, (name, error)
