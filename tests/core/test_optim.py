"""Optimizers against per-parameter float64 references (and torch.optim when installed), allocation-free steps,
hyperparameter validation, checkpoints, and clip_grad_norm."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from neuroflow.buffers.flat import FlatParameters
from neuroflow.optim import SGD, Adam, AdamW, Optimizer, clip_grad_norm
from neuroflow.tensor import Tensor

SHAPES = [(4, 3), (3,), (2, 2, 2), (1,)]
STEPS = 6

CONFIGS: list[tuple[type[Optimizer], dict[str, Any]]] = [
    (SGD, {"lr": 0.1}),
    (SGD, {"lr": 0.1, "momentum": 0.9}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (SGD, {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1}),
    (SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
    (SGD, {"lr": 0.05, "weight_decay": 0.2}),
    (Adam, {"lr": 1e-2}),
    (Adam, {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    (Adam, {"lr": 1e-2, "betas": (0.0, 0.5)}),
    (AdamW, {"lr": 1e-2}),
    (AdamW, {"lr": 1e-2, "betas": (0.85, 0.95), "weight_decay": 0.3}),
]
IDS = [f"{cls.__name__}-" + "-".join(f"{k}={v}" for k, v in kw.items()) for cls, kw in CONFIGS]


# ------------------------------------------------------------------------------------------- references
def reference_sgd(params: list[np.ndarray], grads: list[list[np.ndarray]], lrs: list[float], lr: float,
                  momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                  dampening: float = 0.0) -> list[np.ndarray]:
    """torch.optim.SGD, one parameter at a time."""
    params = [p.copy() for p in params]
    bufs = [np.zeros_like(p) for p in params]
    for t, (step_grads, step_lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            d = g + weight_decay * p
            if momentum:
                bufs[i] = d.copy() if t == 1 else momentum * bufs[i] + (1 - dampening) * d
                d = d + momentum * bufs[i] if nesterov else bufs[i]
            params[i] = p - step_lr * d
    return params


def reference_adam(params: list[np.ndarray], grads: list[list[np.ndarray]], lrs: list[float], lr: float = 1e-3,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                   decoupled: bool = False) -> list[np.ndarray]:
    """torch.optim.Adam (L2) or torch.optim.AdamW (decoupled), one parameter at a time."""
    b1, b2 = betas
    params = [p.copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, (step_grads, step_lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            if decoupled:
                p = p * (1 - step_lr * weight_decay)
            else:
                g = g + weight_decay * p
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            denom = np.sqrt(v[i]) / math.sqrt(1 - b2**t) + eps
            params[i] = p - step_lr / (1 - b1**t) * m[i] / denom
    return params


def reference(cls: type[Optimizer], kwargs: dict[str, Any], params: list[np.ndarray],
              grads: list[list[np.ndarray]], lrs: list[float]) -> list[np.ndarray]:
    if cls is SGD:
        return reference_sgd(params, grads, lrs, **kwargs)
    defaults = {"weight_decay": 0.01} if cls is AdamW else {}
    return reference_adam(params, grads, lrs, **{**defaults, **kwargs}, decoupled=cls is AdamW)


# ------------------------------------------------------------------------------------------- helpers
def random_problem(seed: int = 0, dtype: Any = np.float64) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]
    grads = [[rng.standard_normal(shape).astype(dtype) for shape in SHAPES] for _ in range(STEPS)]
    return params, grads


def as_tensors(arrays: list[np.ndarray]) -> list[Tensor]:
    return [Tensor(a.copy(), requires_grad=True) for a in arrays]


def run(opt: Optimizer, tensors: list[Tensor], grads: list[list[np.ndarray]], lrs: list[float | None]) -> None:
    """Bind (unless bound), then one step per gradient set, writing each gradient through the parameter views."""
    if opt._flat is None:
        opt.bind_parameters(tensors)
    for step_grads, lr in zip(grads, lrs, strict=True):
        for t, g in zip(tensors, step_grads, strict=True):
            t.grad[...] = g
        opt.step(lr)


def scheduled_lrs(base: float) -> list[float]:
    return [base * f for f in (1.0, 0.5, 1.5, 1.0, 0.25, 2.0)][:STEPS]


# ------------------------------------------------------------------------------------------- correctness
@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_matches_per_parameter_reference(cls: type[Optimizer], kwargs: dict[str, Any]) -> None:
    params, grads = random_problem()
    tensors = as_tensors(params)
    run(cls(**kwargs), tensors, grads, [None] * STEPS)
    expected = reference(cls, kwargs, params, grads, [kwargs["lr"]] * STEPS)
    for t, e in zip(tensors, expected, strict=True):
        np.testing.assert_allclose(t.data, e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_step_lr_argument_overrides_base_lr(cls: type[Optimizer], kwargs: dict[str, Any]) -> None:
    params, grads = random_problem(seed=1)
    tensors = as_tensors(params)
    lrs = scheduled_lrs(kwargs["lr"])
    opt = cls(**kwargs)
    run(opt, tensors, grads, list(lrs))
    expected = reference(cls, kwargs, params, grads, lrs)
    for t, e in zip(tensors, expected, strict=True):
        np.testing.assert_allclose(t.data, e, rtol=1e-12, atol=1e-14)
    assert opt.lr == kwargs["lr"]
    assert opt.step_count == STEPS


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_matches_torch_optim(cls: type[Optimizer], kwargs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    params, grads = random_problem(seed=2)
    tensors = as_tensors(params)
    lrs = scheduled_lrs(kwargs["lr"])
    run(cls(**kwargs), tensors, grads, list(lrs))

    torch_params = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    torch_cls = {SGD: torch.optim.SGD, Adam: torch.optim.Adam, AdamW: torch.optim.AdamW}[cls]
    torch_opt = torch_cls(torch_params, **kwargs)
    for step_grads, lr in zip(grads, lrs, strict=True):
        for p, g in zip(torch_params, step_grads, strict=True):
            p.grad = torch.tensor(g, dtype=torch.float64)
        for group in torch_opt.param_groups:
            group["lr"] = lr
        torch_opt.step()
    for t, p in zip(tensors, torch_params, strict=True):
        np.testing.assert_allclose(t.data, p.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_float32_follows_float64_reference() -> None:
    params, grads = random_problem(seed=3, dtype=np.float32)
    tensors = as_tensors(params)
    run(AdamW(lr=1e-2, weight_decay=0.1), tensors, grads, [None] * STEPS)
    expected = reference_adam([p.astype(np.float64) for p in params],
                              [[g.astype(np.float64) for g in gs] for gs in grads],
                              [1e-2] * STEPS, lr=1e-2, weight_decay=0.1, decoupled=True)
    for t, e in zip(tensors, expected, strict=True):
        assert t.data.dtype == np.float32
        np.testing.assert_allclose(t.data, e, rtol=1e-5, atol=1e-6)


def final_params(opt: Optimizer, seed: int = 4) -> list[np.ndarray]:
    params, grads = random_problem(seed)
    tensors = as_tensors(params)
    run(opt, tensors, grads, [None] * STEPS)
    return [t.data.copy() for t in tensors]


def assert_differ(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True)) > 1e-4


def test_nesterov_differs_from_plain_momentum() -> None:
    assert_differ(final_params(SGD(lr=0.1, momentum=0.9, nesterov=True)), final_params(SGD(lr=0.1, momentum=0.9)))


def test_weight_decay_changes_sgd_and_adam() -> None:
    assert_differ(final_params(SGD(lr=0.1, weight_decay=0.1)), final_params(SGD(lr=0.1)))
    assert_differ(final_params(Adam(lr=1e-2, weight_decay=0.1)), final_params(Adam(lr=1e-2)))


def test_adamw_decoupled_decay_differs_from_adam_l2() -> None:
    assert_differ(final_params(AdamW(lr=1e-2, weight_decay=0.1)), final_params(Adam(lr=1e-2, weight_decay=0.1)))
    # Without weight decay the two are the same algorithm.
    for a, b in zip(final_params(AdamW(lr=1e-2, weight_decay=0.0)), final_params(Adam(lr=1e-2)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_adamw_default_weight_decay_is_decoupled_001() -> None:
    opt = AdamW()
    assert (opt.lr, opt.betas, opt.eps, opt.weight_decay) == (1e-3, (0.9, 0.999), 1e-8, 0.01)
    opt = AdamW(lr=0.1, weight_decay=0.5)
    flat = opt.bind_parameters([Tensor(np.full(3, 2.0), requires_grad=True)])
    opt.step()  # zero gradient: m / (sqrt(v) + eps) is 0, so only the decoupled decay moves the weights
    np.testing.assert_allclose(flat.data, 2.0 * (1 - 0.1 * 0.5))


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_step_leaves_gradient_untouched(cls: type[Optimizer], kwargs: dict[str, Any]) -> None:
    params, grads = random_problem(seed=5)
    tensors = as_tensors(params)
    run(cls(**kwargs), tensors, grads[:3], [None] * 3)
    for t, g in zip(tensors, grads[2], strict=True):
        np.testing.assert_array_equal(t.grad, g)


def test_bind_parameters_turns_parameters_into_views_of_the_flat_buffers() -> None:
    params, _ = random_problem()
    tensors = as_tensors(params)
    opt = SGD(lr=1.0)
    flat = opt.bind_parameters(tensors)
    assert isinstance(flat, FlatParameters) and opt.flat is flat
    flat.grad[...] = 1.0
    opt.step()
    for t, p in zip(tensors, params, strict=True):
        np.testing.assert_allclose(t.data, p - 1.0)


# ------------------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_steps_after_the_first_allocate_nothing(cls: type[Optimizer], kwargs: dict[str, Any], dtype: Any) -> None:
    size = 200_000
    rng = np.random.default_rng(0)
    tensors = [Tensor(rng.standard_normal(size // 2).astype(dtype), requires_grad=True) for _ in range(2)]
    opt = cls(**kwargs)
    flat = opt.bind_parameters(tensors)
    flat.grad[...] = rng.standard_normal(size).astype(dtype)
    opt.step()
    numpy_data = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]

    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(numpy_data)
        tracemalloc.reset_peak()
        current, _ = tracemalloc.get_traced_memory()
        for lr in (None, 0.5 * opt.lr, np.float64(opt.lr)):  # a numpy scalar lr must not promote float32 buffers
            opt.step(lr)
        _, peak = tracemalloc.get_traced_memory()
        after = tracemalloc.take_snapshot().filter_traces(numpy_data)
    finally:
        tracemalloc.stop()
    grown = [stat for stat in after.compare_to(before, "traceback") if stat.size_diff > 0 or stat.count_diff > 0]
    assert grown == []
    # Temporaries freed within a step never reach a snapshot; the peak catches them (any full-size temporary
    # would add size * itemsize bytes, far above the few small Python objects a step may create).
    assert peak - current < flat.data.nbytes // 20


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_state_nbytes_predicts_what_bind_allocates(cls: type[Optimizer], kwargs: dict[str, Any]) -> None:
    opt = cls(**kwargs)
    flat = opt.bind_parameters(as_tensors(random_problem(dtype=np.float32)[0]))
    allocated = sum(a.nbytes for a in opt.state.values()) + opt._scratch.nbytes
    assert opt.state_nbytes(flat.size, 4) == allocated
    assert all(a.dtype == np.float32 and a.shape == (flat.size,) for a in opt.state.values())


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_chunked_update_is_bit_identical_to_one_pass(cls: type[Optimizer], kwargs: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The generic update runs chunk by chunk with a small scratch: the same bits as a single pass."""
    import neuroflow.optim.base as base

    rng = np.random.default_rng(3)
    size = 1000
    params = [rng.standard_normal(size).astype(np.float32)]
    grads = [[rng.standard_normal(size).astype(np.float32)] for _ in range(STEPS)]
    finals = []
    for chunk in (size, 64, 7):  # one pass, a few chunks, a ragged last chunk
        monkeypatch.setattr(base, "CHUNK", chunk)
        tensors = as_tensors(params)
        opt = cls(**kwargs)
        run(opt, tensors, grads, scheduled_lrs(kwargs["lr"]))
        assert opt._scratch.shape == (chunk,)
        finals.append(tensors[0].data.copy())
    for other in finals[1:]:
        np.testing.assert_array_equal(other, finals[0])


def test_scratch_is_one_chunk_not_a_copy_of_the_parameters() -> None:
    from neuroflow.optim.base import CHUNK

    size = 4 * CHUNK + 3
    opt = SGD(lr=0.1, momentum=0.9)
    opt.bind_parameters([Tensor(np.zeros(size, np.float32), requires_grad=True)])
    assert opt._scratch.nbytes == CHUNK * 4
    assert opt.state_nbytes(size, 4) == (size + CHUNK) * 4


# ------------------------------------------------------------------------------------------- validation
BAD: list[tuple[Callable[[], Optimizer], str]] = [
    (lambda: SGD(lr=0.0), "lr"),
    (lambda: SGD(lr=-0.1), "lr"),
    (lambda: SGD(lr=float("nan")), "lr"),
    (lambda: SGD(lr=0.1, momentum=-0.5), "momentum"),
    (lambda: SGD(lr=0.1, weight_decay=-1.0), "weight_decay"),
    (lambda: SGD(lr=0.1, dampening=1.5), "dampening"),
    (lambda: SGD(lr=0.1, nesterov=True), "nesterov"),
    (lambda: SGD(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "nesterov"),
    (lambda: Adam(lr=-1e-3), "lr"),
    (lambda: Adam(betas=(1.0, 0.999)), r"betas\[0\]"),
    (lambda: Adam(betas=(0.9, -0.1)), r"betas\[1\]"),
    (lambda: Adam(betas=(0.9,)), "pair"),
    (lambda: Adam(eps=-1e-8), "eps"),
    (lambda: AdamW(weight_decay=-0.01), "weight_decay"),
    # numbers are numbers: a string or a bool is refused, not converted
    (lambda: SGD(lr="0.01"), r"SGD: lr must be a number; got '0.01' \(str\)"),  # type: ignore[arg-type]
    (lambda: AdamW(lr=True), r"AdamW: lr must be a number; got True \(bool\)"),
    (lambda: SGD(lr=0.1, momentum="0.9"), "momentum must be a number"),  # type: ignore[arg-type]
    (lambda: Adam(betas=("0.9", 0.999)), r"betas\[0\] must be a number"),  # type: ignore[arg-type]
    (lambda: Adam(eps="1e-8"), "eps must be a number"),  # type: ignore[arg-type]
    (lambda: SGD(lr=0.1, momentum=0.9, nesterov="yes"), "nesterov must be True or False"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("make", "names"), BAD, ids=[name for _, name in BAD])
def test_bad_hyperparameters_raise_value_error_naming_the_argument(make: Callable[[], Optimizer], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        make()


def test_numbers_of_any_real_type_are_taken_as_floats() -> None:
    """An int is a float (the numeric tower) and numpy's scalars are numbers: accepted and stored as floats."""
    opt = Adam(lr=1, betas=(np.float32(0.5), 0.75), eps=np.float64(1e-6), weight_decay=0)
    assert opt.get_config() == {"lr": 1.0, "betas": (0.5, 0.75), "eps": 1e-6, "weight_decay": 0.0}
    assert all(type(v) is float for v in (opt.lr, *opt.betas, opt.eps, opt.weight_decay))


def test_step_before_bind_raises() -> None:
    with pytest.raises(RuntimeError, match="bind"):
        AdamW().step()


@pytest.mark.parametrize("lr", [-1.0, float("inf"), float("nan")])
def test_step_rejects_bad_lr(lr: float) -> None:
    opt = SGD(lr=0.1)
    opt.bind_parameters(as_tensors(random_problem()[0]))
    with pytest.raises(ValueError, match="lr"):
        opt.step(lr)
    assert opt.step_count == 0


# ------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("bind_first", [False, True], ids=["load-then-bind", "bind-then-load"])
@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS, ids=IDS)
def test_state_dict_round_trip_continues_identically(cls: type[Optimizer], kwargs: dict[str, Any],
                                                      bind_first: bool) -> None:
    params, grads = random_problem(seed=6)
    original = as_tensors(params)
    opt = cls(**kwargs)
    run(opt, original, grads[:3], [None] * 3)
    saved = opt.state_dict()
    assert saved["type"] == cls.__name__ and saved["step"] == 3
    assert all(isinstance(a, np.ndarray) and a.base is None for a in saved["state"].values())

    restored_tensors = as_tensors([t.data for t in original])
    restored = cls(lr=1.0)  # every hyperparameter comes from the state_dict
    if bind_first:
        restored.bind_parameters(restored_tensors)
    restored.load_state_dict(saved)
    run(opt, original, grads[3:], [None] * 3)
    run(restored, restored_tensors, grads[3:], [None] * 3)
    assert restored.get_config() == opt.get_config()
    for a, b in zip(original, restored_tensors, strict=True):
        np.testing.assert_array_equal(a.data, b.data)


def test_state_dict_arrays_are_copies() -> None:
    opt = Adam(lr=1e-2)
    run(opt, as_tensors(random_problem()[0]), random_problem()[1][:1], [None])
    saved = opt.state_dict()
    before = saved["state"]["exp_avg"].copy()
    opt.flat.grad[...] = 1.0
    opt.step()
    np.testing.assert_array_equal(saved["state"]["exp_avg"], before)


def test_load_state_dict_rejects_other_optimizers_and_sizes() -> None:
    opt = Adam(lr=1e-2)
    run(opt, as_tensors(random_problem()[0]), random_problem()[1][:1], [None])
    with pytest.raises(ValueError, match="AdamW"):
        AdamW().load_state_dict(opt.state_dict())
    small = Adam()
    small.bind_parameters([Tensor(np.zeros(3), requires_grad=True)])
    with pytest.raises(ValueError, match="shape"):
        small.load_state_dict(opt.state_dict())
    bad = opt.state_dict()
    bad["hyperparameters"]["betas"] = (1.5, 0.9)
    with pytest.raises(ValueError, match="betas"):
        Adam().load_state_dict(bad)


def test_rebinding_starts_fresh_state() -> None:
    params, grads = random_problem(seed=7)
    opt = SGD(lr=0.1, momentum=0.9)
    run(opt, as_tensors(params), grads, [None] * STEPS)
    fresh = as_tensors(params)
    opt.bind_parameters(fresh)
    assert opt.step_count == 0
    run(opt, fresh, grads, [None] * STEPS)
    for t, e in zip(fresh, reference_sgd(params, grads, [0.1] * STEPS, lr=0.1, momentum=0.9), strict=True):
        np.testing.assert_allclose(t.data, e, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------- clip_grad_norm
def test_clip_grad_norm_scales_down_to_max_norm_and_returns_the_norm_before() -> None:
    grad = np.array([3.0, 4.0, 0.0])
    assert clip_grad_norm(grad, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(grad, [0.6, 0.8, 0.0])
    assert np.linalg.norm(grad) == pytest.approx(1.0)


@pytest.mark.parametrize("max_norm", [5.0, 10.0])
def test_clip_grad_norm_leaves_small_gradients_alone(max_norm: float) -> None:
    grad = np.array([3.0, -4.0], dtype=np.float32)
    assert clip_grad_norm(grad, max_norm) == pytest.approx(5.0)
    np.testing.assert_array_equal(grad, np.array([3.0, -4.0], dtype=np.float32))


def test_clip_grad_norm_is_global_over_the_flat_buffer() -> None:
    grad = np.ones(100)
    assert clip_grad_norm(grad, 2.0) == pytest.approx(10.0)
    np.testing.assert_allclose(grad, 0.2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_clip_grad_norm_returns_nonfinite_norm_without_scaling(bad: float) -> None:
    grad = np.array([3.0, bad, 4.0])
    norm = clip_grad_norm(grad, 1.0)
    assert not math.isfinite(norm)
    np.testing.assert_array_equal(grad[[0, 2]], [3.0, 4.0])


@pytest.mark.parametrize("max_norm", [0.0, -1.0, float("nan"), float("inf"), "1.0", True])
def test_clip_grad_norm_rejects_bad_max_norm(max_norm: float) -> None:
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm(np.ones(3), max_norm)
