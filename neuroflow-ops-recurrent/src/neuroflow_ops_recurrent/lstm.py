"""LSTM with PyTorch's equations and gate order (i, f, g, o).

    i, f, o = σ(·), g = tanh(·) of W_ih x + b_ih + W_hh h + b_hh
    c' = f ⊙ c + i ⊙ g,    h' = o ⊙ tanh(c')
"""

from __future__ import annotations

from typing import Any

from neuroflow_ops_recurrent.recurrence import RecurrentLayer


class LSTM(RecurrentLayer):
    """Long short-term memory; same parameters, shapes and results as ``torch.nn.LSTM(batch_first=True)``.

    The state is the pair (h, c). BPTT caches the activated gates and the
    cell-state sequence besides the input and the hidden sequence; backward
    overwrites both caches (with the gates' local derivatives, then their
    gradients), so each forward serves one backward. Truncation cuts h and c
    together.

    Example::

        lstm = LSTM(8, 32)
        h = lstm.forward(x)              # (batch, time, 8) -> (batch, 32)
        gx = lstm.backward(gh)
    """

    gates = 4
    state_names = ("h", "c")

    def _recur(self, u: Any, initial: tuple[Any, ...] | None) -> None:
        xp, hidden = self.xp, self.hidden_size
        batch, time, cell_inputs = u.shape
        # σ(a) = ½ tanh(a/2) + ½: with the σ gates' pre-activations halved (exact in binary floating
        # point), one tanh over all four gates and one multiply-add activate them all.
        scale = self.buffer("gate_scale", (4 * hidden,), u.dtype)
        shift = self.buffer("gate_shift", (4 * hidden,), u.dtype)
        scale.fill(0.5)
        scale[2 * hidden:3 * hidden] = 1.0
        shift.fill(0.5)
        shift[2 * hidden:3 * hidden] = 0.0
        w_hh = self.buffer("w_hh_scaled", (hidden, 4 * hidden), u.dtype)
        xp.multiply(self.weight_hh_l0.data.T, scale, out=w_hh)
        gates = self.buffer("gates", (batch, time, 4 * hidden), u.dtype)
        xp.matmul(u.reshape(batch * time, cell_inputs), self.weight_ih_l0.data.T,
                  out=gates.reshape(batch * time, 4 * hidden))
        if self.has_bias:
            bias = self.buffer("bias", (4 * hidden,), u.dtype)
            xp.add(self.bias_ih_l0.data, self.bias_hh_l0.data, out=bias)
            gates += bias
        gates *= scale
        c = self.buffer("c", (batch, time, hidden), u.dtype)
        h = self.buffer("h", (batch, time, hidden), u.dtype)
        hh = self.buffer("hh", (batch, 4 * hidden), u.dtype)
        h_prev, c_prev = (None, None) if initial is None else initial
        for t in range(time):
            g = gates[:, t]
            if h_prev is not None:
                xp.matmul(h_prev, w_hh, out=hh)
                g += hh
            xp.tanh(g, out=g)
            g *= scale
            g += shift
            i, f, gg, o = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            ct, ht = c[:, t], h[:, t]
            xp.multiply(i, gg, out=ct)
            if c_prev is not None:
                scratch = hh[:, :hidden]
                xp.multiply(f, c_prev, out=scratch)
                ct += scratch
            xp.tanh(ct, out=ht)
            ht *= o
            h_prev, c_prev = ht, ct
        self._gates, self._c, self._hidden = gates, c, h
        self._final = (h[:, -1], c[:, -1])

    def _begin_backward(self, batch: int, time: int, dtype: Any) -> None:
        """Turn the caches into every factor of a step's Jacobian, for all steps at once.

        Afterwards the gate cache holds, per step, [g·i(1−i), c₋₁·f(1−f), i(1−g²),
        tanh(c)·o(1−o)] (what the gradients of c' and h' are multiplied by to give
        the gates' pre-activation gradients), ``_forget`` holds f and ``_dh_dc``
        holds o(1 − tanh²c), so the loop over steps makes a handful of calls.
        """
        xp, hidden = self.xp, self.hidden_size
        gates, c = self._gates, self._c
        i, f, g, o = (gates[..., k * hidden:(k + 1) * hidden] for k in range(4))
        forget = self.buffer("forget", c.shape, dtype)
        dh_dc = self.buffer("dh_dc", c.shape, dtype)
        xp.tanh(c, out=forget)                       # forget holds tanh(c) for now
        xp.multiply(forget, forget, out=dh_dc)
        xp.subtract(1.0, dh_dc, out=dh_dc)
        dh_dc *= o
        forget *= o
        xp.subtract(1.0, o, out=o)
        o *= forget                                  # tanh(c)·o(1−o)
        forget[...] = f
        xp.subtract(1.0, f, out=f)
        f *= forget
        f[:, 1:] *= c[:, :-1]                        # c₋₁·f(1−f)
        if self._h0 is not None:
            f[:, 0] *= self._h0[1]
        else:
            f[:, 0] = 0
        xp.multiply(g, g, out=c)                     # the cell states are dead: c takes i(1−g²)
        xp.subtract(1.0, c, out=c)
        c *= i
        g *= i
        xp.subtract(1.0, i, out=i)
        i *= g                                       # g·i(1−i)
        g[...] = c
        self._forget, self._dh_dc = forget, dh_dc

    def _step_backward(self, t: int, streams: list[Any], propagate: bool) -> None:
        xp, hidden = self.xp, self.hidden_size
        dh, dc = streams
        batch, slots, _ = dh.shape
        factors = self._gates[:, t].reshape(batch, 4, hidden)
        d_c = self.buffer("d_c", dh.shape, dh.dtype)
        xp.multiply(dh, self._dh_dc[:, t, None], out=d_c)
        d_c += dc                                    # total gradient of c'
        # One stream overwrites the step's factors with its gradients in place; several are summed there.
        d = factors[:, None] if slots == 1 else self.buffer("d_step", (batch, slots, 4, hidden), dh.dtype)
        xp.multiply(d_c[:, :, None], factors[:, None, :3], out=d[:, :, :3])
        xp.multiply(dh, factors[:, None, 3], out=d[:, :, 3])
        if propagate:
            xp.multiply(d_c, self._forget[:, t, None], out=dc)
            xp.matmul(d.reshape(batch * slots, 4 * hidden), self.weight_hh_l0.data,
                      out=dh.reshape(batch * slots, hidden))
        if slots > 1:
            xp.sum(d, axis=1, out=factors)

    def _gradients(self, stop: int) -> tuple[Any, list[tuple[slice, Any]]]:
        self._gates[:, :stop] = 0
        return self._gates, [(slice(None), self._gates)]

    def _cached_shapes(self, batch: int, time: int) -> list[tuple[int, ...]]:
        return [(batch, time, 4 * self.hidden_size), (batch, time, self.hidden_size)]

    def _workspace_shapes(self, batch: int, time: int, slots: int) -> list[tuple[int, ...]]:
        hidden = self.hidden_size
        shapes: list[tuple[int, ...]] = [(4 * hidden,), (4 * hidden,), (hidden, 4 * hidden), (batch, 4 * hidden)]
        shapes += [(4 * hidden,)] if self.has_bias else []
        shapes += [(batch, time, hidden), (batch, time, hidden), (batch, slots, hidden)]
        shapes += [(batch, slots, 4, hidden)] if slots > 1 else []
        return shapes
