"""WaveletElman: an Elman network over the Daubechies-4 multiresolution analysis of its input window.

Each window (batch, time, features) is split by a periodized db4 DWT of
``levels`` levels into levels + 1 full-length, time-aligned bands (the
approximation and every detail level; they sum to the input), and the Elman
recursion reads all bands of all features at every step. The split is a
constant linear map built once per window length (see
:mod:`neuroflow_ops_recurrent.wavelet`), so forward is one matrix product and
backward the transposed product.

Optionally the hidden units use a wavelet activation, as in wavelet-Elman
networks: hₜ = ψ((aₜ − b) / d) with a trainable translation b and dilation d
per unit, ψ the (real) Morlet wavelet cos(1.75u)·e^(−u²/2) or the Mexican
hat (1 − u²)·e^(−u²/2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow import random
from neuroflow.backends.reductions import sum_rows
from neuroflow.errors import ShapeError
from neuroflow.tensor import Tensor
from neuroflow_ops_recurrent import wavelet
from neuroflow_ops_recurrent.elman import NONLINEARITIES, Elman

WAVELET_ACTIVATIONS = ("morlet", "mexican_hat")
MORLET_FREQUENCY = 1.75


class WaveletElman(Elman):
    """Elman RNN over the db4 wavelet bands of its input window; optional Morlet/Mexican-hat hidden units.

    ``weight_ih_l0`` has shape (hidden, (levels + 1)·input_size): column
    j·input_size + f weighs band j of feature f, bands ordered as
    ``pywt.mra``: approximation, then details from coarse to fine. The window
    length must be a multiple of 2**levels. With a wavelet ``nonlinearity`` the
    op has ``translation`` and ``dilation`` parameters (hidden,) and also
    caches the scaled pre-activations.

    Example::

        net = WaveletElman(1, 16, levels=2, nonlinearity="mexican_hat")
        h = net.forward(windows)         # (batch, 32, 1) -> (batch, 16)
        gx = net.backward(gh)
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        levels: int = 2,
        nonlinearity: str = "tanh",
        bias: bool = True,
        return_sequences: bool = False,
        bptt_steps: int | None = None,
        stateful: bool = False,
        dtype: Any = np.float32,
    ) -> None:
        if isinstance(levels, bool) or int(levels) < 1:
            raise ValueError(f"WaveletElman needs levels >= 1; got {levels!r}")
        if int(input_size) <= 0:
            raise ValueError(f"WaveletElman needs a positive input_size; got {input_size}")
        super().__init__(
            (int(levels) + 1) * int(input_size), hidden_size, nonlinearity=nonlinearity, bias=bias,
            return_sequences=return_sequences, bptt_steps=bptt_steps, stateful=stateful, dtype=dtype,
        )
        self.input_size = int(input_size)
        self.levels = int(levels)
        self.wavelet_activation = nonlinearity in WAVELET_ACTIVATIONS
        if self.wavelet_activation:
            # Spread translations so that few units start at ψ'(0) = 0, where both wavelets are flat.
            rng = random.generator()
            self.translation = Tensor(rng.uniform(-1.0, 1.0, self.hidden_size).astype(dtype), requires_grad=True)
            self.dilation = Tensor(np.ones(self.hidden_size, dtype=dtype), requires_grad=True)
        self._transforms: dict[tuple[int, str], Any] = {}
        self._scaled: Any = None

    @classmethod
    def _nonlinearities(cls) -> tuple[str, ...]:
        return NONLINEARITIES + WAVELET_ACTIVATIONS

    # ----------------------------------------------------------------- the wavelet transform
    def _check_time(self, time: int) -> None:
        if time % (2**self.levels):
            raise ShapeError(
                f"{self!r} got a window of {time} steps; its {self.levels}-level db4 transform "
                f"needs a multiple of {2**self.levels}"
            )

    def transform_matrix(self, time: int, dtype: Any) -> Any:
        """The (time·(levels+1)·input_size, time·input_size) map of a flattened window, on this op's backend."""
        key = (int(time), np.dtype(dtype).str)
        matrix = self._transforms.get(key)
        if matrix is None:
            host = wavelet.window_transform(int(time), self.levels, self.input_size).astype(dtype)
            matrix = self.backend.from_host(host)
            self._transforms[key] = matrix
        return matrix

    def _moved_to(self, backend: Any) -> None:
        self._transforms.clear()

    def _transform_input(self, x: Any) -> Any:
        batch, time, _ = x.shape
        u = self.buffer("u", (batch, time, self.cell_input_size), x.dtype)
        self.xp.matmul(x.reshape(batch, -1), self.transform_matrix(time, x.dtype).T, out=u.reshape(batch, -1))
        return u

    def _transform_grad(self, grad_u: Any) -> Any:
        batch, time, _ = grad_u.shape
        gx = self.buffer("grad_x", (batch, time, self.input_size), grad_u.dtype)
        self.xp.matmul(grad_u.reshape(batch, -1), self.transform_matrix(time, grad_u.dtype),
                       out=gx.reshape(batch, -1))
        return gx

    # ----------------------------------------------------------------- wavelet activation
    def _begin_recursion(self, batch: int, time: int, dtype: Any) -> None:
        if self.wavelet_activation:
            self._scaled = self.buffer("scaled", (batch, time, self.hidden_size), dtype)

    def _activate(self, t: int, a: Any) -> None:
        if not self.wavelet_activation:
            super()._activate(t, a)
            return
        xp = self.xp
        u = self._scaled[:, t]
        xp.subtract(a, self.translation.data, out=u)
        u /= self.dilation.data
        square = self.buffer("act_tmp", u.shape, u.dtype)
        xp.multiply(u, u, out=square)
        if self.nonlinearity == "mexican_hat":
            xp.multiply(square, -0.5, out=a)
            xp.exp(a, out=a)
            xp.subtract(1.0, square, out=square)
            a *= square
        else:
            square *= -0.5
            xp.exp(square, out=square)
            xp.multiply(u, MORLET_FREQUENCY, out=a)
            xp.cos(a, out=a)
            a *= square

    def _derivative(self, t: int, out: Any) -> None:
        if not self.wavelet_activation:
            super()._derivative(t, out)
            return
        xp = self.xp
        u = self._scaled[:, t]
        envelope = self.buffer("act_tmp", u.shape, u.dtype)
        xp.multiply(u, u, out=envelope)
        if self.nonlinearity == "mexican_hat":
            xp.multiply(envelope, -0.5, out=out)
            xp.exp(out, out=out)
            envelope -= 3.0
            envelope *= u
            out *= envelope                                   # ψ'(u) = u(u² − 3) e^(−u²/2)
        else:
            envelope *= -0.5
            xp.exp(envelope, out=envelope)
            sine = self.buffer("act_tmp2", u.shape, u.dtype)
            xp.multiply(u, MORLET_FREQUENCY, out=out)
            xp.sin(out, out=sine)
            sine *= MORLET_FREQUENCY
            xp.cos(out, out=out)
            out *= u
            out += sine
            out *= envelope
            xp.negative(out, out=out)                         # ψ'(u) = −(ω sin ωu + u cos ωu) e^(−u²/2)
        out /= self.dilation.data                             # da = du / d

    def _activation_gradients(self, d_pre: Any) -> None:
        if not self.wavelet_activation:
            return
        xp = self.xp
        g = self.buffer("g_activation", (self.hidden_size,), d_pre.dtype)
        # u = (a − b)/d, so ∂L/∂b = −Σ ∂L/∂a and ∂L/∂d = −Σ ∂L/∂a · u.
        sum_rows(xp, d_pre.reshape(-1, self.hidden_size), out=g)  # over batch·time rows, blocked
        xp.negative(g, out=g)
        self.accumulate_grad(self.translation, g)
        scaled = self._scaled
        scaled *= d_pre
        sum_rows(xp, scaled.reshape(-1, self.hidden_size), out=g)
        xp.negative(g, out=g)
        self.accumulate_grad(self.dilation, g)

    # ----------------------------------------------------------------- declarations
    def _cached_shapes(self, batch: int, time: int) -> list[tuple[int, ...]]:
        return [(batch, time, self.hidden_size)] if self.wavelet_activation else []

    def _workspace_shapes(self, batch: int, time: int, slots: int) -> list[tuple[int, ...]]:
        shapes = super()._workspace_shapes(batch, time, slots)
        if self.needs_input_grad:
            shapes.append((batch, time, self.cell_input_size))                 # gradient of the bands
        shapes.append((time * self.cell_input_size, time * self.input_size))    # the transform, kept per window
        if self.wavelet_activation:
            hidden = (batch, self.hidden_size)
            shapes += [hidden, (self.hidden_size,)] + ([hidden] if self.nonlinearity == "morlet" else [])
        return shapes

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "levels": self.levels}

    def _extra_repr(self) -> list[str]:
        return [f"levels={self.levels}"] + super()._extra_repr()
