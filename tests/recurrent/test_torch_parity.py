"""Numerical parity with torch.nn.RNN / GRU / LSTM (batch_first) with weights copied by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow import ops

torch = pytest.importorskip("torch")

CASES = [
    ("Elman", {}, lambda f, h, **kw: torch.nn.RNN(f, h, batch_first=True, **kw)),
    ("Elman", {"nonlinearity": "relu"}, lambda f, h, **kw: torch.nn.RNN(f, h, batch_first=True, nonlinearity="relu", **kw)),
    ("GRU", {}, lambda f, h, **kw: torch.nn.GRU(f, h, batch_first=True, **kw)),
    ("LSTM", {}, lambda f, h, **kw: torch.nn.LSTM(f, h, batch_first=True, **kw)),
]


@pytest.mark.parametrize(("name", "options", "make_torch"), CASES, ids=["rnn-tanh", "rnn-relu", "gru", "lstm"])
@pytest.mark.parametrize("return_sequences", [False, True], ids=["last", "sequences"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "h0"])
def test_forward_and_gradients_match_torch(name: str, options: dict, make_torch: Any, return_sequences: bool,
                                           bias: bool, with_state: bool) -> None:
    batch, time, features, hidden = 3, 6, 4, 5
    op = getattr(ops, name)(features, hidden, bias=bias, return_sequences=return_sequences, **options)
    op.astype(np.float64)
    reference = make_torch(features, hidden, bias=bias).double()
    reference.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in op.state_dict().items()})  # same names

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, time, features))
    state: Any = None
    torch_state: Any = None
    if with_state:
        h0 = rng.standard_normal((batch, hidden))
        if name == "LSTM":
            c0 = rng.standard_normal((batch, hidden))
            state, torch_state = (h0, c0), (torch.from_numpy(h0)[None], torch.from_numpy(c0)[None])
        else:
            state, torch_state = h0, torch.from_numpy(h0)[None]
    op.state = state
    y = op.forward(x)
    tx = torch.from_numpy(x).requires_grad_(True)
    ty, _ = reference(tx, torch_state)
    ty = ty if return_sequences else ty[:, -1]
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)

    g = rng.standard_normal(y.shape)
    gx = op.backward(g)
    ty.backward(torch.from_numpy(g))
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    for param_name, param in reference.named_parameters():
        np.testing.assert_allclose(getattr(op, param_name).grad, param.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=param_name)


def test_parameter_names_and_shapes_match_torch() -> None:
    for op, module in [(ops.Elman(4, 5), torch.nn.RNN(4, 5)), (ops.GRU(4, 5), torch.nn.GRU(4, 5)),
                       (ops.LSTM(4, 5), torch.nn.LSTM(4, 5))]:
        ours = [(n, p.shape) for n, p in op.named_parameters()]
        theirs = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
        assert ours == theirs
