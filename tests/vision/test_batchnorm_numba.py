"""BatchNorm2d on numba's compiled kernels (NHWC on numpy): the numpy code's results, float64 statistics, any thread
count, the output written again bit for bit; numpy wherever the kernels do not apply or numba cannot be had."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow.backends import cpu_parallel
from neuroflow_ops_vision import BatchNorm2d, compiled

from .conftest import HAS_NUMBA, on_numpy
from .reference import batch_norm_train

pytestmark = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed: pip install 'neuroflow-ops-vision[numba]'")


def step(bn: BatchNorm2d, x: np.ndarray, gy: np.ndarray) -> tuple[np.ndarray, ...]:
    bn.zero_grad()
    y = bn.forward(x).copy()
    gx = bn.backward(gy).copy()
    return y, gx, bn.weight.grad.copy(), bn.bias.grad.copy(), bn.running_mean.data.copy(), bn.running_var.data.copy()


def made(c: int, activation: str | None, dtype: Any, rng: np.random.Generator) -> BatchNorm2d:
    bn = BatchNorm2d(c, activation=activation, layout="NHWC", dtype=dtype)
    bn.weight.data[...] = rng.uniform(0.5, 1.5, c)
    bn.bias.data[...] = rng.standard_normal(c)
    return bn


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (16, 12, 12, 32), (1, 1, 300, 7)], ids=str)
def test_float64_matches_the_numpy_code(shape: tuple[int, ...], activation: str | None,
                                        rng: np.random.Generator) -> None:
    x = rng.standard_normal(shape) * 3 + 1
    gy = rng.standard_normal(shape)
    want = on_numpy(lambda: step(made(shape[-1], activation, np.float64, np.random.default_rng(1)), x, gy))
    got = step(made(shape[-1], activation, np.float64, np.random.default_rng(1)), x, gy)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_the_kernels_run(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """Each of the four kernels is called by an NHWC training step (and the numpy passes are not)."""
    kernels = compiled.kernels("batchnorm_numba", np, np.float32)  # compiled now: its warm-up calls are not counted
    assert kernels is not None
    called: list[str] = []
    for name in ("statistics", "normalise", "gradient_statistics", "input_gradient"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _real=real, _name=name: (called.append(_name), _real(*a))[1])
    bn = made(8, "relu", np.float32, rng)
    monkeypatch.setattr(BatchNorm2d, "_passes", lambda *a: pytest.fail("a numpy pass ran"))
    x = rng.standard_normal((4, 6, 6, 8)).astype(np.float32)
    bn.backward(bn.forward(x).copy())
    assert called == ["statistics", "normalise", "gradient_statistics", "input_gradient"]


def test_float32_statistics_keep_their_digits(rng: np.random.Generator) -> None:
    """131,072 values per channel with a mean: the float32 step against the float64 truth, within what float32's own
    rounding of the output and gradient allows (the sums are taken in float64)."""
    x = (rng.standard_normal((32, 64, 64, 4)) * 0.5 + 3.0)
    gy = rng.standard_normal(x.shape)
    truth = step(made(4, "relu", np.float64, np.random.default_rng(1)), x, gy)
    got = step(made(4, "relu", np.float32, np.random.default_rng(1)), x.astype(np.float32), gy.astype(np.float32))
    y_err = np.abs(got[0] - truth[0]).max() / np.abs(truth[0]).max()
    assert y_err < 4e-7, y_err  # float32's half ulp, 6e-8, a few times over
    for name, a, b in (("gx", got[1], truth[1]), ("weight", got[2], truth[2]), ("bias", got[3], truth[3])):
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 2e-6, (name, err)


def test_results_do_not_depend_on_the_thread_count(rng: np.random.Generator, every_size_splits: None) -> None:
    x = rng.standard_normal((8, 20, 20, 16)).astype(np.float32)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        cpu_parallel.set_threads(threads)
        try:
            results.append(step(made(16, "relu", np.float32, np.random.default_rng(2)), x, gy))
        finally:
            cpu_parallel.set_threads(None)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_output_written_again_is_the_forward_output(rng: np.random.Generator) -> None:
    bn = made(8, "relu", np.float32, rng)
    x = (rng.standard_normal((4, 5, 5, 8)) * 1e3 + 5e4).astype(np.float32)  # centred: the second pass's output
    y = bn.forward(x).copy()
    np.testing.assert_array_equal(bn.write_output_again(), y)
    np.testing.assert_allclose(y, np.maximum(batch_norm_train(x.astype(np.float64).transpose(0, 3, 1, 2),
                                                              bn.weight.data.astype(np.float64),
                                                              bn.bias.data.astype(np.float64), 1e-5), 0)
                               .transpose(0, 2, 3, 1), atol=2e-3)


def test_eval_a_strided_gradient_and_nan_give_the_numpy_codes_results(rng: np.random.Generator) -> None:
    """Eval mode (the compiled output pass with the running statistics) and a gradient in another memory order give
    the numpy code's results; a NaN in the input stays NaN through the fused ReLU, as numpy's maximum keeps it."""
    x = rng.standard_normal((3, 4, 5, 6))
    gy = np.asfortranarray(rng.standard_normal(x.shape))
    want = on_numpy(lambda: step(made(6, "relu", np.float64, np.random.default_rng(1)), x, gy))
    bn = made(6, "relu", np.float64, np.random.default_rng(1))
    np.testing.assert_allclose(step(bn, x, gy)[1], want[1], rtol=1e-12, atol=1e-12)
    bn.eval()
    want_eval = on_numpy(lambda: bn.forward(x).copy())
    np.testing.assert_allclose(bn.forward(x), want_eval, rtol=1e-13, atol=1e-13)
    bn.train()
    x[0, 0, 0, 0] = np.nan
    assert np.isnan(bn.forward(x)[0, 0, 0, 0])
