"""The opencl optimizer kernels (adam_update, sgd_update) against the generic updates on the cpu backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow.buffers.flat import FlatParameters
from neuroflow.tensor import Tensor

# 16 lanes of float32 per work item, 64 items per group: sizes below, at and past one vector, a tail that is not
# a whole one, and one work item past a whole group (the rest of its group has nothing to update)
SIZES = (5, 16, 37, 1000, 64 * 16 + 5)
TOLERANCES = {np.float32: (2e-5, 1e-6), np.float64: (1e-12, 1e-14)}  # (rtol, atol)


def _parameters(size: int, seed: int = 0, dtype: Any = np.float32) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(size).astype(dtype)
    grads = [rng.standard_normal(size).astype(dtype) for _ in range(3)]
    return data, grads


def _train(optimizer: Any, xp: Any, data: np.ndarray, grads: list[np.ndarray], backend: Any = None,
           lead: int = 0) -> dict[str, np.ndarray]:
    """Three steps of ``optimizer`` on parameters that start ``lead`` elements into their flat buffers."""
    params = [Tensor(np.zeros(lead, data.dtype), requires_grad=True)] if lead else []
    params.append(Tensor(data.copy(), requires_grad=True))
    flat = FlatParameters([Tensor(xp.asarray(p.data), requires_grad=True) for p in params], xp)
    optimizer.bind(flat, backend)
    for g in grads:
        flat.grad[lead:] = xp.asarray(g)
        optimizer.step()
    host = np.asarray(backend.to_host(flat.data) if backend else flat.data)
    state = {name: np.asarray(backend.to_host(a) if backend else a)[lead:] for name, a in optimizer.state.items()}
    return {"data": host[lead:], **state}


OPTIMIZERS = {
    "adam": lambda: nf.optim.Adam(lr=1e-2),
    "adam_l2": lambda: nf.optim.Adam(lr=1e-2, weight_decay=0.1),
    "adamw": lambda: nf.optim.AdamW(lr=1e-2, weight_decay=0.1),
    "sgd": lambda: nf.optim.SGD(lr=0.1),
    "momentum": lambda: nf.optim.SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "nesterov": lambda: nf.optim.SGD(lr=0.1, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("lead", [0, 3])
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=lambda d: np.dtype(d).name)
def test_fused_update_matches_the_generic_one(backend: Any, name: str, size: int, lead: int, dtype: Any) -> None:
    if dtype == np.float64 and not backend.cl_device.facts.fp64:
        pytest.skip("the device has no double precision")
    data, grads = _parameters(size, dtype=dtype)
    expected = _train(OPTIMIZERS[name](), np, data, grads, lead=lead)
    optimizer = OPTIMIZERS[name]()
    got = _train(optimizer, backend.xp, data, grads, backend, lead=lead)
    assert optimizer.fused("sgd_update" if name in ("sgd", "momentum", "nesterov") else "adam_update") is not None
    assert sorted(got) == sorted(expected)
    rtol, atol = TOLERANCES[dtype]
    for key in expected:
        assert got[key].dtype == expected[key].dtype, key
        np.testing.assert_allclose(got[key], expected[key], rtol=rtol, atol=atol, err_msg=key)


def test_adam_update_refuses_step_zero_and_strided_buffers(backend: Any) -> None:
    xp = backend.xp
    adam = backend.kernel("adam_update")
    dense = xp.zeros(8, np.float32)
    settings = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "decoupled": False}
    with pytest.raises(ValueError, match="step is 1-based; got 0"):
        adam(dense, dense, dense, dense, step=0, **settings)
    with pytest.raises(ValueError, match="grad must be a dense 1-D buffer"):
        adam(dense, xp.zeros(16, np.float32)[::2], dense, dense, step=1, **settings)
