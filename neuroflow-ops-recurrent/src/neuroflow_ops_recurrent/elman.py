"""Elman RNN: hₜ = f(xₜ W_ihᵀ + b_ih + hₜ₋₁ W_hhᵀ + b_hh), f = tanh or ReLU, as torch.nn.RNN."""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow_ops_recurrent.recurrence import RecurrentLayer

NONLINEARITIES = ("tanh", "relu")


class Elman(RecurrentLayer):
    """Simple recurrent layer trained by (optionally truncated) backpropagation through time.

    Input (batch, time, input_size); output (batch, hidden_size) from the last
    step, or (batch, time, hidden_size) with ``return_sequences=True``.
    BPTT needs only the input and the hidden sequence: the derivative of tanh
    or ReLU is read off the hidden state itself.

    Example::

        rnn = Elman(1, 16)                       # many-to-one
        h = rnn.forward(x)                       # x: (batch, time, 1) -> (batch, 16)
        gx = rnn.backward(gh)                    # fills weight_ih_l0.grad, weight_hh_l0.grad, ...
        Elman(8, 32, return_sequences=True, bptt_steps=10, stateful=True)
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        nonlinearity: str = "tanh",
        bias: bool = True,
        return_sequences: bool = False,
        bptt_steps: int | None = None,
        stateful: bool = False,
        dtype: Any = np.float32,
    ) -> None:
        if nonlinearity not in self._nonlinearities():
            raise ValueError(
                f"{type(self).__name__}: unknown nonlinearity {nonlinearity!r}; "
                f"available: {', '.join(self._nonlinearities())}"
            )
        super().__init__(
            input_size, hidden_size, bias=bias, return_sequences=return_sequences,
            bptt_steps=bptt_steps, stateful=stateful, dtype=dtype,
        )
        self.nonlinearity = nonlinearity
        self._dpre: Any = None

    @classmethod
    def _nonlinearities(cls) -> tuple[str, ...]:
        return NONLINEARITIES

    # ----------------------------------------------------------------- forward
    def _recur(self, u: Any, initial: tuple[Any, ...] | None) -> None:
        xp = self.xp
        batch, time, cell_inputs = u.shape
        h = self.buffer("h", (batch, time, self.hidden_size), u.dtype)
        h2 = h.reshape(batch * time, self.hidden_size)
        xp.matmul(u.reshape(batch * time, cell_inputs), self.weight_ih_l0.data.T, out=h2)
        if self.has_bias:
            bias = self.buffer("bias", (self.hidden_size,), u.dtype)
            xp.add(self.bias_ih_l0.data, self.bias_hh_l0.data, out=bias)
            h2 += bias
        self._begin_recursion(batch, time, u.dtype)
        hh = self.buffer("hh", (batch, self.hidden_size), u.dtype)
        w_hh_t = self.weight_hh_l0.data.T
        previous = None if initial is None else initial[0]
        for t in range(time):
            a = h[:, t]
            if previous is not None:
                xp.matmul(previous, w_hh_t, out=hh)
                a += hh
            self._activate(t, a)
            previous = a
        self._hidden = h
        self._final = (h[:, -1],)

    def _begin_recursion(self, batch: int, time: int, dtype: Any) -> None:
        """Take the per-sequence caches the activation needs (none for tanh and ReLU)."""

    def _activate(self, t: int, a: Any) -> None:
        """Apply the nonlinearity to step t's pre-activation ``a``, in place."""
        if self.nonlinearity == "tanh":
            self.xp.tanh(a, out=a)
        else:
            self.xp.maximum(a, 0, out=a)

    # ----------------------------------------------------------------- backward
    def _derivative(self, t: int, out: Any) -> None:
        """Write df/da at step t into ``out`` (batch, hidden)."""
        h = self._hidden[:, t]
        if self.nonlinearity == "tanh":
            self.xp.multiply(h, h, out=out)
            self.xp.subtract(1.0, out, out=out)
        else:
            self.xp.greater(h, 0, out=out)

    def _begin_backward(self, batch: int, time: int, dtype: Any) -> None:
        self._dpre = self.buffer("d_pre", (batch, time, self.hidden_size), dtype)

    def _step_backward(self, t: int, streams: list[Any], propagate: bool) -> None:
        xp = self.xp
        dh = streams[0]
        batch, slots, hidden = dh.shape
        deriv = self.buffer("deriv", (batch, hidden), dh.dtype)
        self._derivative(t, deriv)
        # One stream writes straight into the step's row of the gradient; several are summed there.
        d = self._dpre[:, t, None] if slots == 1 else self.buffer("d_step", dh.shape, dh.dtype)
        xp.multiply(dh, deriv[:, None, :], out=d)
        if slots > 1:
            xp.sum(d, axis=1, out=self._dpre[:, t])
        if propagate:
            xp.matmul(d.reshape(batch * slots, hidden), self.weight_hh_l0.data, out=dh.reshape(batch * slots, hidden))

    def _gradients(self, stop: int) -> tuple[Any, list[tuple[slice, Any]]]:
        d = self._dpre
        d[:, :stop] = 0
        self._activation_gradients(d)
        return d, [(slice(None), d)]

    def _activation_gradients(self, d_pre: Any) -> None:
        """Accumulate the gradients of the activation's own parameters (none for tanh and ReLU)."""

    # ----------------------------------------------------------------- declarations
    def _cached_shapes(self, batch: int, time: int) -> list[tuple[int, ...]]:
        return []

    def _workspace_shapes(self, batch: int, time: int, slots: int) -> list[tuple[int, ...]]:
        hidden = (batch, self.hidden_size)
        shapes: list[tuple[int, ...]] = [hidden, (batch, time, self.hidden_size), hidden]
        shapes += [(batch, slots, self.hidden_size)] if slots > 1 else []
        shapes += [(self.hidden_size,)] if self.has_bias else []
        return shapes

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "nonlinearity": self.nonlinearity}

    def _extra_repr(self) -> list[str]:
        return [] if self.nonlinearity == "tanh" else [f"nonlinearity={self.nonlinearity!r}"]
