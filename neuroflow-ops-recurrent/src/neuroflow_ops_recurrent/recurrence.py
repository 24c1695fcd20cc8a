"""What every recurrent op shares: parameters, input checks, the forward and backward over a sequence.

Layout is batch-first: inputs (batch, time, features), hidden sequences
(batch, time, hidden). Parameters carry PyTorch's names, shapes and gate
order (``weight_ih_l0`` (gates·hidden, input), ``weight_hh_l0`` (gates·hidden,
hidden), ``bias_ih_l0``, ``bias_hh_l0``), so weights move by name.

Truncated BPTT (``bptt_steps``) is defined in :mod:`.truncation`, the state a
stateful op carries between forwards in :mod:`.state`, the arithmetic the
cells share in :mod:`.arithmetic`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from neuroflow import random
from neuroflow.backends.reductions import sum_rows
from neuroflow.errors import ShapeError
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow.tensor import Tensor
from neuroflow_ops_recurrent.arithmetic import recurrent_weight_grad, sigmoid_, sum_streams
from neuroflow_ops_recurrent.state import carried, checked_state
from neuroflow_ops_recurrent.truncation import Window, receive_output_gradient, window

__all__ = ["RecurrentLayer", "sigmoid_", "sum_streams"]  # the cells' arithmetic, importable from here as before


class RecurrentLayer(Operator):
    """Base of the recurrent ops; subclasses supply the cell (forward recursion and one backward step).

    Subclass contract:

    - ``_recur(u, initial)`` runs the recursion over the cell input ``u``
      (batch, time, cell inputs) from ``initial`` (tuple of (batch, hidden)
      arrays, or None for zeros), filling its caches and ``self._hidden``
      (batch, time, hidden), plus ``self._final`` (the state after the last step);
    - ``_step_backward(t, streams, propagate)`` turns the state gradients of
      step t (``streams``: one (batch, slots, hidden) array per state component)
      into the step's pre-activation gradients and, when ``propagate``, into the
      state gradients of step t−1, in place;
    - ``_gradients(stop)`` returns the pre-activation gradients for the input
      weights and, as (row slice, array) pairs, for the recurrent weights;
      steps before ``stop`` received no gradient and must read as zero;
    - ``_cached_shapes`` / ``_workspace_shapes`` declare its own buffers.
    """

    gates: ClassVar[int] = 1
    state_names: ClassVar[tuple[str, ...]] = ("h",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        bias: bool = True,
        return_sequences: bool = False,
        bptt_steps: int | None = None,
        stateful: bool = False,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if int(input_size) <= 0 or int(hidden_size) <= 0:
            raise ValueError(f"{name} needs positive sizes; got input_size={input_size}, hidden_size={hidden_size}")
        if bptt_steps is not None and (isinstance(bptt_steps, bool) or int(bptt_steps) < 1):
            raise ValueError(f"{name}: bptt_steps must be None (full BPTT) or an integer >= 1; got {bptt_steps!r}")
        self.input_size = int(input_size)
        self.cell_input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.has_bias = bool(bias)
        self.return_sequences = bool(return_sequences)
        self.bptt_steps = None if bptt_steps is None else int(bptt_steps)
        self.stateful = bool(stateful)
        self._init_parameters(self.cell_input_size, dtype)
        self._state: tuple[Any, ...] | None = None
        self._u: Any = None
        self._h0: tuple[Any, ...] | None = None
        self._hidden: Any = None
        self._final: tuple[Any, ...] = ()
        self._consumed = False

    def _init_parameters(self, cell_inputs: int, dtype: Any) -> None:
        """PyTorch's initialisation: every parameter uniform in ±1/√hidden."""
        rows, bound, rng = self.gates * self.hidden_size, 1.0 / math.sqrt(self.hidden_size), random.generator()
        self.weight_ih_l0 = Tensor(rng.uniform(-bound, bound, (rows, cell_inputs)).astype(dtype), requires_grad=True)
        self.weight_hh_l0 = Tensor(rng.uniform(-bound, bound, (rows, self.hidden_size)).astype(dtype), requires_grad=True)
        if self.has_bias:
            self.bias_ih_l0 = Tensor(rng.uniform(-bound, bound, rows).astype(dtype), requires_grad=True)
            self.bias_hh_l0 = Tensor(rng.uniform(-bound, bound, rows).astype(dtype), requires_grad=True)

    # ----------------------------------------------------------------- carried state
    @property
    def state(self) -> Any:
        """The state the next forward starts from (None: zeros).

        (batch, hidden) for Elman and GRU, an (h, c) pair for LSTM. A stateful
        op replaces it with its final state after every forward; the arrays
        belong to the op and change at the next forward. Assigning copies.
        """
        if self._state is None:
            return None
        return self._state if len(self.state_names) > 1 else self._state[0]

    @state.setter
    def state(self, value: Any) -> None:
        if value is None:
            self._state = None
            return
        parts = checked_state(self, value, self.state_names, self.hidden_size)
        dtype = self.weight_hh_l0.data.dtype
        self._state = tuple(self.xp.array(part, dtype=dtype, copy=True) for part in parts)

    def reset_state(self) -> None:
        """Start the next forward from zeros (call between independent sequences of a stateful op)."""
        self._state = None

    # ----------------------------------------------------------------- forward / backward
    def forward(self, x: Any) -> Any:
        batch, time = self._check_sequence(x)
        initial = None
        if self._state is not None:
            initial = tuple(self._copy(f"{name}0", part) for name, part in zip(self.state_names, self._state))
        elif self.stateful:  # zeros in the buffers later calls use, so the first step takes every buffer
            initial = tuple(self.buffer(f"{name}0", (batch, self.hidden_size), x.dtype) for name in self.state_names)
            for part in initial:
                part.fill(0)
        u = self._transform_input(x)
        self._u, self._h0, self._consumed = u, initial, False
        self._recur(u, initial)
        if self.stateful:
            self._state = carried(self.xp, self._state, self._final)
        if self.return_sequences:
            return self._hidden
        out = self.buffer("out", (batch, self.hidden_size), x.dtype)
        out[...] = self._hidden[:, -1]
        return out

    def backward(self, grad_out: Any) -> Any:
        if self._u is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        if self._consumed:
            raise RuntimeError(f"{self!r}.backward called twice for one forward; run forward again first")
        batch, time, _ = self._u.shape
        expected = (batch, time, self.hidden_size) if self.return_sequences else (batch, self.hidden_size)
        if tuple(getattr(grad_out, "shape", ())) != expected:
            raise ShapeError(
                f"{self!r}.backward got gradient of shape {getattr(grad_out, 'shape', None)}; expected {expected}"
            )
        self._consumed = True
        span = self._window(time)
        slots, stop = span.slots, span.stop
        streams = [self.buffer(f"d{name}", (batch, slots, self.hidden_size), grad_out.dtype) for name in self.state_names]
        for stream in streams:
            stream.fill(0)
        self._begin_backward(batch, time, grad_out.dtype)
        for t in range(time - 1, stop - 1, -1):
            receive_output_gradient(streams, grad_out, t, time, span, self.return_sequences)
            self._step_backward(t, streams, propagate=t > stop)
        grad_u = self._parameter_gradients(stop)
        return None if grad_u is None else self._transform_grad(grad_u)

    def _window(self, time: int) -> Window:
        """The backward's window over ``time`` steps under this op's truncation."""
        return window(self.bptt_steps, self.return_sequences, time)

    def _parameter_gradients(self, stop: int) -> Any:
        """Accumulate every parameter's gradient from the pre-activation gradients; return the cell input's
        (None when the runtime says the input needs none: ``needs_input_grad`` is False on a first layer)."""
        xp, u = self.xp, self._u
        batch, time, cell_inputs = u.shape
        d_ih, d_hh_parts = self._gradients(stop)
        d_ih2 = d_ih.reshape(batch * time, -1)
        u2 = u.reshape(batch * time, cell_inputs)
        w_ih, w_hh = self.weight_ih_l0, self.weight_hh_l0
        if w_ih.requires_grad:
            g = self.buffer("g_weight_ih", w_ih.shape, u.dtype)
            xp.matmul(d_ih2.T, u2, out=g)
            self.accumulate_grad(w_ih, g)
        if w_hh.requires_grad:
            g = self.buffer("g_weight_hh", w_hh.shape, u.dtype)
            initial = None if self._h0 is None else self._h0[0]
            for k, (rows, part) in enumerate(d_hh_parts):
                block = g[rows]
                # taken even when unused (batch 1, no initial state): the same buffers at every batch size
                fix = self.buffer(f"g_weight_hh_fix{k}", block.shape, block.dtype)
                recurrent_weight_grad(xp, part, self._hidden, initial, block, fix)
            self.accumulate_grad(w_hh, g)
        if self.has_bias:
            g = self.buffer("g_bias", self.bias_ih_l0.shape, u.dtype)
            sum_rows(xp, d_ih2, out=g)  # over batch·time rows, blocked: float32 keeps its digits
            self.accumulate_grad(self.bias_ih_l0, g)
            if not (len(d_hh_parts) == 1 and d_hh_parts[0][1] is d_ih):
                for rows, part in d_hh_parts:
                    sum_rows(xp, part.reshape(batch * time, -1), out=g[rows])
            self.accumulate_grad(self.bias_hh_l0, g)
        if not self.needs_input_grad:
            return None
        grad_u = self.buffer("grad_in", u.shape, u.dtype)
        xp.matmul(d_ih2, w_ih.data, out=grad_u.reshape(batch * time, cell_inputs))
        return grad_u

    def _previous(self, t: int) -> Any:
        """The hidden state entering step t, or None for the zero state."""
        if t > 0:
            return self._hidden[:, t - 1]
        return None if self._h0 is None else self._h0[0]

    def _copy(self, key: str, value: Any) -> Any:
        out = self.buffer(key, value.shape, value.dtype)
        out[...] = value
        return out

    # ----------------------------------------------------------------- hooks
    def _transform_input(self, x: Any) -> Any:
        """The cell input for ``x``; WaveletElman puts its wavelet transform here."""
        return x

    def _transform_grad(self, grad_u: Any) -> Any:
        return grad_u

    def _recur(self, u: Any, initial: tuple[Any, ...] | None) -> None:
        raise NotImplementedError

    def _begin_backward(self, batch: int, time: int, dtype: Any) -> None:
        """Take the buffers the backward steps write into."""

    def _step_backward(self, t: int, streams: list[Any], propagate: bool) -> None:
        raise NotImplementedError

    def _gradients(self, stop: int) -> tuple[Any, list[tuple[slice, Any]]]:
        raise NotImplementedError

    def _recurrent_row_blocks(self) -> list[int]:
        """Rows of weight_hh_l0 per part that ``_gradients`` returns (all of them, for most cells)."""
        return [self.gates * self.hidden_size]

    def _cached_shapes(self, batch: int, time: int) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def _workspace_shapes(self, batch: int, time: int, slots: int) -> list[tuple[int, ...]]:
        raise NotImplementedError

    # ----------------------------------------------------------------- checks and declarations
    def _check_sequence(self, x: Any) -> tuple[int, int]:
        shape = getattr(x, "shape", None)
        expected = f"(batch, time, {self.input_size})"
        if shape is None:
            raise ShapeError(f"{self!r} got {type(x).__name__}; expected an array of shape {expected}")
        shape = tuple(shape)
        if len(shape) != 3 or shape[2] != self.input_size:
            hint = "; add a feature axis: x[..., None]" if len(shape) == 2 and self.input_size == 1 else ""
            raise ShapeError(f"{self!r} got input of shape {shape}; expected {expected}{hint}")
        if shape[0] == 0 or shape[1] == 0:
            raise ShapeError(f"{self!r} got input of shape {shape}; expected at least one sample and one time step")
        self._check_time(shape[1])
        self.check_input(x, (self.input_size,), min_ndim=3)
        if self._state is not None and self._state[0].shape[0] != shape[0]:
            raise ShapeError(
                f"{self!r} carries state for batch {self._state[0].shape[0]}; got batch {shape[0]}. "
                "Call reset_state() before sequences of another batch size"
            )
        return shape[0], shape[1]

    def _check_time(self, time: int) -> None:
        """Raise ShapeError when the op cannot take ``time`` steps (WaveletElman's window rule)."""

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        """What one forward and backward hold, by shape.

        ``cached``: the cell input (for a plain op, the caller's input), the
        hidden sequence (which is the output when return_sequences), the op's
        own caches, then, when stateful, the initial state of the call and the
        carried state (the last is held by the op between calls, outside the
        pool). ``workspace``: every other buffer forward and backward take,
        except the output and the input gradient.
        """
        shape = tuple(input_shape)
        if len(shape) != 3 or shape[2] != self.input_size or shape[0] < 1 or shape[1] < 1:
            raise ShapeError(f"{self!r} got input of shape {shape}; expected (batch, time, {self.input_size})")
        batch, time, _ = shape
        self._check_time(time)
        hidden = (batch, self.hidden_size)
        output = (batch, time, self.hidden_size) if self.return_sequences else hidden
        cached: list[tuple[int, ...]] = [(batch, time, self.cell_input_size), (batch, time, self.hidden_size)]
        cached += self._cached_shapes(batch, time)
        if self.stateful or self._state is not None:
            cached += [hidden] * len(self.state_names)
        if self.stateful:
            cached += [hidden] * len(self.state_names)
        slots = self._window(time).slots
        rows = self.gates * self.hidden_size
        workspace: list[tuple[int, ...]] = [(batch, slots, self.hidden_size)] * len(self.state_names)
        workspace += [self.weight_ih_l0.shape, self.weight_hh_l0.shape]
        workspace += [(rows,)] if self.has_bias else []
        workspace += [(part, self.hidden_size) for part in self._recurrent_row_blocks()]
        workspace += self._workspace_shapes(batch, time, slots)
        return MemoryDeclaration(output, cached=cached, workspace=workspace)

    def get_config(self) -> dict[str, Any]:
        return {
            "input_size": self.input_size,
            "hidden_size": self.hidden_size,
            "bias": self.has_bias,
            "return_sequences": self.return_sequences,
            "bptt_steps": self.bptt_steps,
            "stateful": self.stateful,
        }

    def _extra_repr(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        extra = self._extra_repr()
        defaults = {"bias": True, "return_sequences": False, "bptt_steps": None, "stateful": False}
        config = self.get_config()
        extra += [f"{key}={config[key]!r}" for key, default in defaults.items() if config[key] != default]
        return f"{type(self).__name__}({self.input_size}→{self.hidden_size}{''.join(', ' + e for e in extra)})"
