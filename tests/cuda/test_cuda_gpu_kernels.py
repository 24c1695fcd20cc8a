"""Each fused kernel against the cpu backend's result for the same inputs (GPU only)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow_cuda import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no usable CUDA device: {unavailable_reason()}")
RTOL, ATOL = 1e-4, 1e-5


def gpu(cuda: Any, array: np.ndarray) -> Any:
    return cuda.from_host(np.ascontiguousarray(array))


@pytest.mark.parametrize("activation", ["relu", "leaky_relu", "sigmoid", "tanh"])
def test_activation_backward_matches_numpy(cuda: Any, activation: str) -> None:
    rng = np.random.default_rng(0)
    v, g = (rng.standard_normal((37, 19)).astype(np.float32) for _ in range(2))
    y = {"relu": np.maximum(v, 0), "leaky_relu": np.where(v > 0, v, 0.01 * v),
         "sigmoid": 1 / (1 + np.exp(-v)), "tanh": np.tanh(v)}[activation]
    cached = v if activation == "leaky_relu" else y
    slope = {"relu": (v > 0), "leaky_relu": np.where(v > 0, 1, 0.01), "sigmoid": y * (1 - y), "tanh": 1 - y * y}[activation]
    gx = gpu(cuda, np.empty_like(v))
    assert cuda.kernel("activation_backward")(gpu(cuda, cached), gpu(cuda, g), gx, activation, 0.01) is gx
    np.testing.assert_allclose(cuda.to_host(gx), g * slope, RTOL, ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_kernels_match_the_core_linear_on_the_cpu(cuda: Any, dtype: type) -> None:
    from neuroflow import ops

    rng = np.random.default_rng(5)
    layer = ops.Linear(70, 33, dtype=dtype)
    x = rng.standard_normal((300, 70)).astype(dtype)
    g = rng.standard_normal((300, 33)).astype(dtype)
    y = layer.forward(x)
    layer.backward(g)
    w, b = gpu(cuda, layer.weight.data), gpu(cuda, layer.bias.data)
    out = gpu(cuda, np.empty_like(y))
    assert cuda.kernel("linear")(gpu(cuda, x), w, b, out) is out
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}
    np.testing.assert_allclose(cuda.to_host(out), y, **tol)
    gw, gb = gpu(cuda, np.empty_like(layer.weight.data)), gpu(cuda, np.empty_like(layer.bias.data))
    wide = gpu(cuda, np.concatenate([g, g[:, :5]], axis=1))
    for grad in (gpu(cuda, g), wide[:, :33]):  # contiguous, and a strided slice of a wider gradient
        cuda.kernel("linear_weight_grad")(grad, gpu(cuda, x), gw, gb)
        np.testing.assert_allclose(cuda.to_host(gw), layer.weight.grad, **tol)
        np.testing.assert_allclose(cuda.to_host(gb), layer.bias.grad, **tol)


def test_a_linear_on_cuda_trains_as_its_generic_code_does(cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same steps with the fused Linear kernels and with them handed back to the generic code."""
    import neuroflow as nf
    from neuroflow_cuda.backend import CudaBackend

    def train(disabled: str) -> np.ndarray:
        monkeypatch.setenv("NEUROFLOW_CUDA_DISABLE", disabled)
        backend = CudaBackend(0)
        assert (backend.kernel("linear") is None) == bool(disabled)
        nf.manual_seed(0)
        model = nf.Sequential(nf.ops.Linear(20, 16), nf.ops.ReLU(), nf.ops.Linear(16, 4))
        trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.1), device=backend, batch_size=32, progress=False)
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((64, 20)).astype(np.float32), rng.integers(0, 4, 64)
        for _ in range(3):
            trainer.train_step(x, y)
        return trainer.predict(x)

    np.testing.assert_allclose(train(""), train("linear,linear_weight_grad"), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_cross_entropy_matches_the_core_loss(cuda: Any, smoothing: float) -> None:
    import neuroflow as nf

    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((64, 300)) * 5).astype(np.float32)
    labels = rng.integers(0, 300, 64)
    loss = nf.losses.CrossEntropy(label_smoothing=smoothing)
    expected = loss.forward(logits.copy(), labels)
    grad = loss.backward(scale=0.5)
    probs, rows = gpu(cuda, np.empty_like(logits)), gpu(cuda, np.empty(64, np.float32))
    got = cuda.kernel("softmax_cross_entropy")(gpu(cuda, logits), gpu(cuda, labels), probs, rows, smoothing)
    assert got == pytest.approx(expected, rel=1e-5)
    cuda.kernel("softmax_cross_entropy_backward")(probs, gpu(cuda, labels), 0.5, smoothing)
    np.testing.assert_allclose(cuda.to_host(probs), grad, RTOL, 1e-6)


@pytest.mark.parametrize("name,kwargs", [
    ("Adam", {"lr": 1e-3, "weight_decay": 0.01}), ("AdamW", {"lr": 1e-3, "weight_decay": 0.05}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}), ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
])
def test_optimizer_kernels_match_the_core_optimizers_over_three_steps(cuda: Any, name: str, kwargs: dict[str, Any]) -> None:
    import neuroflow as nf
    from neuroflow.tensor import Tensor

    rng = np.random.default_rng(4)
    p0 = rng.standard_normal(1000).astype(np.float32)
    grads = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    opt = getattr(nf.optim, name)(**kwargs)
    flat = opt.bind_parameters([Tensor(p0.copy(), requires_grad=True)])
    data, grad = gpu(cuda, p0), gpu(cuda, np.zeros(1000, np.float32))
    state = [gpu(cuda, np.zeros(1000, np.float32)) for _ in range(2)]
    for step, g in enumerate(grads, start=1):
        flat.grad[...] = g
        opt.step()
        grad[...] = cuda.from_host(g)
        if name.startswith("Adam"):
            cuda.kernel("adam_update")(data, grad, *state, lr=kwargs["lr"], beta1=0.9, beta2=0.999, eps=1e-8,
                                       weight_decay=kwargs["weight_decay"], decoupled=name == "AdamW", step=step)
        else:
            cuda.kernel("sgd_update")(data, grad, state[0], lr=kwargs["lr"], momentum=kwargs["momentum"],
                                      nesterov=kwargs.get("nesterov", False), weight_decay=kwargs.get("weight_decay", 0.0),
                                      first=step == 1)
    np.testing.assert_allclose(cuda.to_host(data), flat.data, 1e-5, 1e-6)
