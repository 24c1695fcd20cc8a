"""Array arithmetic the recurrent cells share: an overflow-free sigmoid, sums over gradient streams, and the
gradient of a recurrent weight over a whole sequence."""

from __future__ import annotations

from typing import Any


def sigmoid_(xp: Any, a: Any) -> None:
    """Logistic sigmoid of ``a`` in place, as ½(1 + tanh(a/2)) so it never overflows."""
    xp.multiply(a, 0.5, out=a)
    xp.tanh(a, out=a)
    a += 1.0
    a *= 0.5


def sum_streams(xp: Any, d: Any, out: Any) -> None:
    """out ← Σ over the stream axis (1) of ``d``; a copy when there is one stream (a reduction costs 4× more)."""
    if d.shape[1] == 1:
        out[...] = d[:, 0]
    else:
        xp.sum(d, axis=1, out=out)


def recurrent_weight_grad(xp: Any, d: Any, hidden: Any, initial: Any, out: Any, fix: Any) -> None:
    """out ← Σ over batch b and step t of d[b, t]ᵀ h[b, t−1], with h[b, −1] = ``initial`` (None: zeros).

    ``d`` and ``hidden`` are (batch, time, ·); ``fix`` is a workspace of ``out``'s shape.
    """
    batch, time, _ = hidden.shape
    # In the flattened (batch·time) arrays, row b·T+t of d pairs with row b·T+t−1 of the hidden
    # states: one GEMM, then the batch−1 pairs that straddle two sequences (t = 0) are swapped
    # for the initial state. No copy of either operand is needed.
    d2 = d.reshape(batch * time, -1)
    h2 = hidden.reshape(batch * time, -1)
    xp.matmul(d2[1:].T, h2[:-1], out=out)
    if batch > 1:
        xp.matmul(d[1:, 0].T, hidden[:-1, time - 1], out=fix)
        out -= fix
    if initial is not None:
        xp.matmul(d[:, 0].T, initial, out=fix)
        out += fix
