"""A naive float64 reference for the recurrent ops: textbook per-step loops, nothing shared with the ops.

Gradients of the reference come from finite differences, so truncated BPTT
is checked through its definition: the output at step t, recomputed from the
(constant) state that entered step t−k+1.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sigmoid(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a))


def wavelet_bands(x: np.ndarray, levels: int) -> np.ndarray:
    """(batch, time, features) → (batch, time, (levels+1)·features) by PyWavelets' MRA, band-major per step."""
    import warnings

    import pywt

    batch, time, features = x.shape
    out = np.empty((batch, time, (levels + 1) * features))
    for b in range(batch):
        for f in range(features):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # boundary effects reach every coefficient: expected
                bands = pywt.mra(x[b, :, f], "db4", level=levels, transform="dwt", mode="periodization")
            for j, band in enumerate(bands):
                out[b, :, j * features + f] = band
    return out


def activation(name: str, a: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
    if name == "tanh":
        return np.tanh(a)
    if name == "relu":
        return np.maximum(a, 0.0)
    u = (a - params["translation"]) / params["dilation"]
    if name == "mexican_hat":
        return (1 - u**2) * np.exp(-(u**2) / 2)
    return np.cos(1.75 * u) * np.exp(-(u**2) / 2)


def step(kind: str, params: dict[str, np.ndarray], x: np.ndarray, state: tuple[np.ndarray, ...],
         nonlinearity: str = "tanh") -> tuple[np.ndarray, ...]:
    """One cell step: PyTorch's equations, written out."""
    w_ih, w_hh = params["weight_ih_l0"], params["weight_hh_l0"]
    b_ih = params.get("bias_ih_l0", np.zeros(w_ih.shape[0]))
    b_hh = params.get("bias_hh_l0", np.zeros(w_ih.shape[0]))
    h = state[0]
    gi = x @ w_ih.T + b_ih
    gh = h @ w_hh.T + b_hh
    if kind == "elman":
        return (activation(nonlinearity, gi + gh, params),)
    hidden = h.shape[1]
    if kind == "gru":
        r = sigmoid(gi[:, :hidden] + gh[:, :hidden])
        z = sigmoid(gi[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
        n = np.tanh(gi[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
        return ((1 - z) * n + z * h,)
    a = gi + gh
    i, f = sigmoid(a[:, :hidden]), sigmoid(a[:, hidden:2 * hidden])
    g, o = np.tanh(a[:, 2 * hidden:3 * hidden]), sigmoid(a[:, 3 * hidden:])
    c = f * state[1] + i * g
    return (o * np.tanh(c), c)


def run(kind: str, params: dict[str, np.ndarray], x: np.ndarray, state: tuple[np.ndarray, ...] | None,
        nonlinearity: str = "tanh") -> list[tuple[np.ndarray, ...]]:
    """The state after every step of the cell input ``x`` (batch, time, inputs), from ``state`` (None: zeros)."""
    batch, hidden = x.shape[0], params["weight_hh_l0"].shape[1]
    if state is None:
        state = tuple(np.zeros((batch, hidden)) for _ in range(2 if kind == "lstm" else 1))
    states = []
    for t in range(x.shape[1]):
        state = step(kind, params, x[:, t], state, nonlinearity)
        states.append(state)
    return states


def outputs(kind: str, params: dict[str, np.ndarray], x: np.ndarray, state: Any, return_sequences: bool,
            nonlinearity: str = "tanh") -> np.ndarray:
    hs = np.stack([s[0] for s in run(kind, params, x, state, nonlinearity)], axis=1)
    return hs if return_sequences else hs[:, -1]


def truncated_objective(kind: str, params: dict[str, np.ndarray], x: np.ndarray, weights: np.ndarray,
                        bptt_steps: int | None, return_sequences: bool, state: Any,
                        frozen: list[tuple[np.ndarray, ...]], nonlinearity: str = "tanh") -> float:
    """Σₜ ⟨weightsₜ, yₜ⟩ where yₜ is recomputed over its last ``bptt_steps`` steps from the state in ``frozen``.

    ``frozen`` are the states of the unperturbed run: the entry state of each
    window does not move with the parameters, which is what truncation means.
    """
    time = x.shape[1]
    k = time if bptt_steps is None else bptt_steps
    targets = range(time) if return_sequences else [time - 1]
    total = 0.0
    for t in targets:
        start = max(0, t - k + 1)
        entry = state if start == 0 else frozen[start - 1]
        y = run(kind, params, x[:, start:t + 1], entry, nonlinearity)[-1][0]
        w = weights[:, t] if return_sequences else weights
        total += float(np.sum(w * y))
    return total


KINDS = {"Elman": "elman", "WaveletElman": "elman", "GRU": "gru", "LSTM": "lstm"}


def check_op(op: Any, x: np.ndarray, state: Any = None, seed: int = 0, directions: int = 2, rtol: float = 1e-6) -> None:
    """Compare a float64 op with the reference: outputs exactly, gradients by directional finite differences.

    Both the input gradient and every parameter gradient are checked, for
    ``directions`` random directions, against the truncated objective.
    """
    rng = np.random.default_rng(seed)
    kind = KINDS[type(op).__name__]
    nonlinearity = getattr(op, "nonlinearity", "tanh")
    levels = getattr(op, "levels", None)

    def cell_input(xx: np.ndarray) -> np.ndarray:
        return xx if levels is None else wavelet_bands(xx, levels)

    op.astype(np.float64)
    x = np.array(x, dtype=np.float64)
    names = [name for name, p in op.named_parameters() if p.requires_grad]
    params = {name: p.data.copy() for name, p in op.named_parameters()}
    op.zero_grad()
    op.state = state
    if state is not None and kind != "lstm":
        state = (state,)
    y = np.array(op.forward(x))
    expected = outputs(kind, params, cell_input(x), state, op.return_sequences, nonlinearity)
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12, err_msg=f"{op!r} forward")
    weights = rng.standard_normal(y.shape)
    gx = np.array(op.backward(weights))
    grads = {name: np.array(p.grad) for name, p in op.named_parameters() if p.requires_grad}
    frozen = run(kind, params, cell_input(x), state, nonlinearity)

    def objective(xx: np.ndarray, pp: dict[str, np.ndarray]) -> float:
        return truncated_objective(kind, pp, cell_input(xx), weights, op.bptt_steps, op.return_sequences,
                                   state, frozen, nonlinearity)

    eps = 1e-6
    for _ in range(directions):
        vx = rng.standard_normal(x.shape)
        vp = {name: rng.standard_normal(params[name].shape) for name in names}
        analytic = float(np.sum(gx * vx)) + sum(float(np.sum(grads[n] * vp[n])) for n in names)
        plus = objective(x + eps * vx, {**params, **{n: params[n] + eps * vp[n] for n in names}})
        minus = objective(x - eps * vx, {**params, **{n: params[n] - eps * vp[n] for n in names}})
        numeric = (plus - minus) / (2 * eps)
        if not abs(analytic - numeric) <= 1e-7 + rtol * abs(numeric):
            raise AssertionError(f"{op!r}: directional derivative {analytic:.10g}, finite differences {numeric:.10g}")
