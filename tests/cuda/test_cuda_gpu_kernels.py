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


@pytest.mark.parametrize("activation", ["identity", "relu", "leaky_relu", "sigmoid", "tanh"])
def test_bias_activation_forward_and_backward_match_numpy(cuda: Any, activation: str) -> None:
    rng = np.random.default_rng(0)
    x, b, g = (rng.standard_normal(s).astype(np.float32) for s in ((37, 19), (19,), (37, 19)))
    v = x + b
    y = {"identity": v, "relu": np.maximum(v, 0), "leaky_relu": np.where(v > 0, v, 0.01 * v),
         "sigmoid": 1 / (1 + np.exp(-v)), "tanh": np.tanh(v)}[activation]
    cached = v if activation == "leaky_relu" else y
    slope = {"identity": 1, "relu": (v > 0), "leaky_relu": np.where(v > 0, 1, 0.01),
             "sigmoid": y * (1 - y), "tanh": 1 - y * y}[activation]
    out = gpu(cuda, np.empty_like(x))
    cuda.kernel("bias_activation")(gpu(cuda, x), gpu(cuda, b), out, activation)
    np.testing.assert_allclose(cuda.to_host(out), y, RTOL, ATOL)
    gx, gb = gpu(cuda, np.empty_like(x)), gpu(cuda, np.empty(19, np.float32))
    cuda.kernel("activation_backward")(gpu(cuda, cached), gpu(cuda, g), gx, activation, gbias=gb)
    np.testing.assert_allclose(cuda.to_host(gx), g * slope, RTOL, ATOL)
    np.testing.assert_allclose(cuda.to_host(gb), (g * slope).sum(0), RTOL, 1e-4)


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


@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_matches_the_vision_op(cuda: Any, relu: bool) -> None:
    from neuroflow import ops

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((8, 5, 5, 12)) * 3 + 2).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    bn = ops.BatchNorm2d(12, layout="NHWC", activation="relu" if relu else None)
    bn.weight.data[...] = rng.uniform(0.5, 1.5, 12)
    bn.bias.data[...] = rng.standard_normal(12)
    y, gx = bn.forward(x), bn.backward(g)
    c = 12
    x2, y2 = gpu(cuda, x.reshape(-1, c)), gpu(cuda, np.empty((x.size // c, c), np.float32))
    mean, invstd = gpu(cuda, np.empty(c, np.float32)), gpu(cuda, np.empty(c, np.float32))
    rm, rv = gpu(cuda, np.zeros(c, np.float32)), gpu(cuda, np.ones(c, np.float32))
    gamma, beta = gpu(cuda, bn.weight.data), gpu(cuda, bn.bias.data)
    cuda.kernel("batchnorm_forward")(x2, gamma, beta, y2, mean, invstd, 1e-5, 0.1, rm, rv, relu)
    np.testing.assert_allclose(cuda.to_host(y2).reshape(x.shape), y, 1e-4, 1e-4)
    np.testing.assert_allclose(cuda.to_host(rm), bn.running_mean.data, 1e-4, 1e-5)
    np.testing.assert_allclose(cuda.to_host(rv), bn.running_var.data, 1e-4, 1e-5)
    gx2, gg, gbeta = gpu(cuda, np.empty_like(g).reshape(-1, c)), gpu(cuda, np.empty(c, np.float32)), gpu(cuda, np.empty(c, np.float32))
    cuda.kernel("batchnorm_backward")(x2, gpu(cuda, g.reshape(-1, c)), gamma, mean, invstd, gx2, gg, gbeta,
                                      y2 if relu else None)
    np.testing.assert_allclose(cuda.to_host(gx2).reshape(x.shape), gx, 1e-3, 1e-4)
    np.testing.assert_allclose(cuda.to_host(gg), bn.weight.grad, 1e-3, 1e-3)
    np.testing.assert_allclose(cuda.to_host(gbeta), bn.bias.grad, 1e-3, 1e-3)


@pytest.mark.parametrize("stride,dilation,groups", [((1, 1), (1, 1), 1), ((2, 2), (1, 1), 1), ((1, 2), (2, 1), 2)])
def test_im2col_and_col2im_match_the_vision_windows(cuda: Any, stride: tuple[int, int], dilation: tuple[int, int],
                                                     groups: int) -> None:
    from neuroflow_ops_vision.windows import Geometry, im2col

    rng = np.random.default_rng(3)
    xpad = rng.standard_normal((2, 9, 10, 4)).astype(np.float32)
    geo = Geometry((3, 3), stride, (0, 0), dilation)
    out_hw = geo.out_hw((9, 10))
    col = np.empty((2, *out_hw, groups, 3, 3, 4 // groups), np.float32)
    im2col(np, xpad, geo, out_hw, groups, col)
    dcol = gpu(cuda, np.empty_like(col))
    cuda.kernel("im2col")(gpu(cuda, xpad), dcol, stride, dilation)
    np.testing.assert_array_equal(cuda.to_host(dcol), col)
    # col2im is im2col's adjoint: <im2col(x), c> == <x, col2im(c)> for any c
    c = rng.standard_normal(col.shape).astype(np.float32)
    gx = gpu(cuda, np.empty_like(xpad))
    cuda.kernel("col2im")(gpu(cuda, c), gx, stride, dilation)
    assert float((cuda.to_host(gx) * xpad).sum()) == pytest.approx(float((col * c).sum()), rel=1e-4)


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
