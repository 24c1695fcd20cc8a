"""GRU: gated recurrent unit with PyTorch's equations and gate order (r, z, n).

    r = σ(W_ir x + b_ir + W_hr h + b_hr)
    z = σ(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
    h' = (1 − z) ⊙ n + z ⊙ h
"""

from __future__ import annotations

from typing import Any

from neuroflow_ops_recurrent.arithmetic import sigmoid_, sum_streams
from neuroflow_ops_recurrent.recurrence import RecurrentLayer


class GRU(RecurrentLayer):
    """Gated recurrent unit; same parameters, shapes and results as ``torch.nn.GRU(batch_first=True)``.

    BPTT caches the gates (r, z, n) and W_hn h + b_hn per step besides the
    input and the hidden sequence; backward overwrites the gate cache with the
    gates' gradients, so each forward serves one backward.

    Example::

        gru = GRU(8, 32, return_sequences=True)
        y = gru.forward(x)               # (batch, time, 8) -> (batch, time, 32)
        gx = gru.backward(gy)
    """

    gates = 3

    def _recur(self, u: Any, initial: tuple[Any, ...] | None) -> None:
        xp, hidden = self.xp, self.hidden_size
        batch, time, cell_inputs = u.shape
        gates = self.buffer("gates", (batch, time, 3 * hidden), u.dtype)
        xp.matmul(u.reshape(batch * time, cell_inputs), self.weight_ih_l0.data.T,
                  out=gates.reshape(batch * time, 3 * hidden))
        if self.has_bias:
            gates += self.bias_ih_l0.data
        hn = self.buffer("hn", (batch, time, hidden), u.dtype)
        h = self.buffer("h", (batch, time, hidden), u.dtype)
        hh = self.buffer("hh", (batch, 3 * hidden), u.dtype)
        w_hh_t = self.weight_hh_l0.data.T
        previous = None if initial is None else initial[0]
        for t in range(time):
            if previous is not None:
                xp.matmul(previous, w_hh_t, out=hh)
                if self.has_bias:
                    hh += self.bias_hh_l0.data
            elif self.has_bias:
                hh[...] = self.bias_hh_l0.data
            else:
                hh.fill(0)
            g = gates[:, t]
            rz = g[:, :2 * hidden]
            rz += hh[:, :2 * hidden]
            sigmoid_(xp, rz)
            r, z, n = g[:, :hidden], g[:, hidden:2 * hidden], g[:, 2 * hidden:]
            hn[:, t] = hh[:, 2 * hidden:]
            scratch = hh[:, :hidden]
            xp.multiply(r, hn[:, t], out=scratch)
            n += scratch
            xp.tanh(n, out=n)
            ht = h[:, t]
            if previous is not None:
                xp.subtract(previous, n, out=ht)
            else:
                xp.negative(n, out=ht)
            ht *= z
            ht += n
            previous = ht
        self._gates, self._hn, self._hidden = gates, hn, h
        self._final = (h[:, -1],)

    def _step_backward(self, t: int, streams: list[Any], propagate: bool) -> None:
        xp, hidden = self.xp, self.hidden_size
        dh = streams[0]
        batch, slots, _ = dh.shape
        g, hn = self._gates[:, t], self._hn[:, t]
        r, z, n = g[:, :hidden], g[:, hidden:2 * hidden], g[:, 2 * hidden:]
        previous = self._previous(t)
        c_n = self.buffer("c_n", (batch, hidden), dh.dtype)
        c_z = self.buffer("c_z", (batch, hidden), dh.dtype)
        c_r = self.buffer("c_r", (batch, hidden), dh.dtype)
        # Per-unit factors of the step's Jacobian, shared by every gradient stream.
        xp.subtract(1.0, z, out=c_z)
        xp.multiply(n, n, out=c_n)
        xp.subtract(1.0, c_n, out=c_n)
        c_n *= c_z                                   # ∂h'/∂a_n = (1 − z)(1 − n²)
        c_z *= z
        if previous is not None:
            xp.subtract(previous, n, out=c_r)
            c_z *= c_r                               # ∂h'/∂a_z = (h − n) z (1 − z)
        else:
            c_z *= n
            xp.negative(c_z, out=c_z)
        xp.subtract(1.0, r, out=c_r)
        c_r *= r
        c_r *= hn                                    # ∂a_n/∂a_r = (W_hn h + b_hn) r (1 − r)
        d = self.buffer("d_step", (batch, slots, 3 * hidden), dh.dtype)
        d_n = self.buffer("d_n", (batch, slots, hidden), dh.dtype)
        xp.multiply(dh, c_n[:, None], out=d_n)
        xp.multiply(d_n, r[:, None], out=d[..., 2 * hidden:])   # gradient of W_hn h + b_hn
        xp.multiply(d_n, c_r[:, None], out=d[..., :hidden])
        xp.multiply(dh, c_z[:, None], out=d[..., hidden:2 * hidden])
        # The step's gates are dead from here on: their cache now takes the gates' gradients.
        sum_streams(xp, d_n, g[:, 2 * hidden:])
        sum_streams(xp, d[..., 2 * hidden:], hn)
        if propagate:
            dh *= z[:, None]
            xp.matmul(d.reshape(batch * slots, 3 * hidden), self.weight_hh_l0.data,
                      out=d_n.reshape(batch * slots, hidden))
            dh += d_n
        sum_streams(xp, d[..., :2 * hidden], g[:, :2 * hidden])

    def _gradients(self, stop: int) -> tuple[Any, list[tuple[slice, Any]]]:
        hidden = self.hidden_size
        self._gates[:, :stop] = 0
        self._hn[:, :stop] = 0
        rz = self._gates[..., :2 * hidden]
        return self._gates, [(slice(0, 2 * hidden), rz), (slice(2 * hidden, 3 * hidden), self._hn)]

    def _cached_shapes(self, batch: int, time: int) -> list[tuple[int, ...]]:
        return [(batch, time, 3 * self.hidden_size), (batch, time, self.hidden_size)]

    def _workspace_shapes(self, batch: int, time: int, slots: int) -> list[tuple[int, ...]]:
        hidden = self.hidden_size
        shapes: list[tuple[int, ...]] = [(batch, 3 * hidden), (batch, hidden), (batch, hidden), (batch, hidden)]
        shapes += [(batch, slots, 3 * hidden), (batch, slots, hidden)]
        return shapes

    def _recurrent_row_blocks(self) -> list[int]:
        return [2 * self.hidden_size, self.hidden_size]
