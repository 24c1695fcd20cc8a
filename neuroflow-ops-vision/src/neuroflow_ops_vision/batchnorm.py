"""BatchNorm2d: per-channel normalisation with batch statistics in training, running ones in eval.

PyTorch semantics: biased batch variance to normalise, unbiased variance in
``running_var``, ``running = (1 − momentum)·running + momentum·batch``
(``momentum=None``: cumulative average). Elementwise passes are what cost on
numpy (one thread), so the op reduces with one pass each for the mean and the
variance, writes the output in two, and can fuse a following ReLU
(``activation="relu"``) instead of spending two more passes in a separate op.
On numpy those passes run split over the leading axis between the cores
(:mod:`neuroflow.backends.cpu_parallel`), all passes of a block while it is
in cache; the reductions keep their order.

On NHWC numpy maps with numba installed, the passes are compiled kernels
(:mod:`neuroflow_ops_vision.batchnorm_numba`): two over memory each way, the
statistics in float64; ``NEUROFLOW_NUMBA=0`` keeps the numpy passes.

In a data-parallel run with ``sync_batchnorm=True`` the per-channel sums
(Σx, Σx², and in backward Σg, Σg·x̂) are summed over the ranks through
:attr:`~neuroflow.operator.Operator.cross_rank_sum`, one small allreduce each
way, so every rank normalises with the global batch's statistics and the
training is that of one process with the global batch (PyTorch's
``SyncBatchNorm``).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from neuroflow.backends.cpu_parallel import over_batch
from neuroflow.backends.reductions import dot_channels, dot_rows, sum_channels, sum_rows
from neuroflow.errors import ShapeError
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow.tensor import Tensor
from neuroflow_ops_vision import compiled
from neuroflow_ops_vision.layout import (
    SAME_LAYOUT,
    LayoutSwitch,
    check_declared_shape,
    check_feature_map,
    check_grad,
    check_layout,
    layout_options,
)
from neuroflow_ops_vision.workspace import Workspace

_KERNELS = "batchnorm_numba"


class BatchNorm2d(Operator):
    """Normalises each channel of an (N, C, H, W) map (or (N, H, W, C) with ``layout="NHWC"``).

    Parameters ``weight`` (γ, ones) and ``bias`` (β, zeros); buffers
    ``running_mean`` and ``running_var``, as in PyTorch. ``activation="relu"``
    applies max(·, 0) to the output in the same pass (a Sequential under the
    Trainer runs ``BatchNorm2d → ReLU`` so by itself: see :mod:`neuroflow.fusion`).
    """

    absorbs_activation_after = ("relu",)
    normalises_over_batch = True
    affine_in_eval = True  # see inference_affine

    running_mean: Tensor
    running_var: Tensor

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        activation: str | None = None,
        layout: str = "NCHW",
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        if not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"BatchNorm2d: num_features must be a positive int; got {num_features!r}")
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be in [0, 1] or None; got {momentum}")
        if activation not in (None, "relu"):
            raise ValueError(f"BatchNorm2d: activation must be None or 'relu'; got {activation!r}")
        self.num_features, self.eps = num_features, float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.affine, self.track_running_stats, self.activation = bool(affine), bool(track_running_stats), activation
        self.backward_reads_output = bool(activation)  # the fused ReLU's mask is the output
        self.layout = check_layout(layout, "BatchNorm2d")
        if self.affine:
            self.weight = Tensor(np.ones(num_features, dtype), requires_grad=True)
            self.bias = Tensor(np.zeros(num_features, dtype), requires_grad=True)
        if self.track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(num_features, dtype)))
            self.register_buffer("running_var", Tensor(np.ones(num_features, dtype)))
        self.num_batches_tracked = 0
        # Cached for backward as plain attributes (the memory tracer follows attributes, not tuples); the
        # input through save_input (a parent recomputing this op's output reads its shape there).
        self._y: Any = None
        self._mean: Any = None
        self._invstd: Any = None
        self._scale: Any = None
        self._shift: Any = None
        self._batch_stats = True
        self._count = 0  # the values per channel the batch statistics were taken over (all ranks' when summed)
        self._summed: Any = None  # the cross_rank_sum the last training forward used, for its backward
        self._centre: Any = None  # the mean the last forward's output is centred on, where it had to be
        self._kernels: ModuleType | None = None  # numba's, where the last forward ran them (recompute does too)

    # ------------------------------------------------------------------ views
    def _view(self, a: Any) -> Any:
        """(M, C) for NHWC, (N, C, H·W) for NCHW: channels on a fixed axis, reductions on the rest."""
        if self.layout == "NHWC":
            return a.reshape(-1, self.num_features)
        return a.reshape(a.shape[0], self.num_features, -1)

    def _per_channel(self, v: Any) -> Any:
        """A (C,) vector shaped to broadcast against :meth:`_view`."""
        return v if self.layout == "NHWC" else v[:, None]

    def _sum(self, a2: Any) -> Any:
        """Per-channel Σ a, blocked (:mod:`neuroflow.backends.reductions`): float32 keeps its digits over N·H·W."""
        return sum_rows(self.xp, a2) if self.layout == "NHWC" else sum_channels(self.xp, a2)

    def _passes(self, a: Any, run: Any, arrays: int) -> None:
        """``run(lo, hi)`` over ``a``'s leading axis: on numpy split between threads, in cache-sized blocks."""
        over_batch(self.xp, a.shape[0], run, a.size * arrays, a[0].nbytes * 2 if a.shape[0] else 0)

    def _dot(self, a2: Any, b2: Any) -> Any:
        """Per-channel Σ a·b in one pass, without a temporary, blocked as :meth:`_sum`."""
        return dot_rows(self.xp, a2, b2) if self.layout == "NHWC" else dot_channels(self.xp, a2, b2)

    def _compiled(self, *rows: Any) -> ModuleType | None:
        """numba's kernels where they run ``rows``, (M, C) views of NHWC numpy maps, C-contiguous; else None."""
        if self.layout != "NHWC":
            return None
        kernels = compiled.kernels(_KERNELS, self.xp, rows[0].dtype)
        return kernels if kernels is not None and all(a.flags.c_contiguous for a in rows) else None

    # ------------------------------------------------------------------ computation
    def forward(self, x: Any, out: Any = None) -> Any:
        """Normalise ``x``; into ``out`` when given (a caller that drops the output and calls :meth:`recompute`)."""
        check_feature_map(self, x, self.num_features, self.layout)
        x2 = self._view(x)
        count = x.size // self.num_features
        y = self.buffer("y", x.shape, x.dtype) if out is None else out
        y2 = self._view(y)
        self._kernels = self._compiled(x2, y2)
        batch_stats = self.training or not self.track_running_stats
        # only a training forward joins the other ranks: predict and evaluate run on one rank's own
        self._summed = self.cross_rank_sum if self.training else None
        centre = False
        if batch_stats:
            mean, var, count, centre = self._batch_statistics(x2, y2, count, tuple(x.shape))
            if self.training and self.track_running_stats:
                self._update_running(mean, var, count)
        else:
            mean, var = self.running_mean.data, self.running_var.data
        invstd, self._scale, self._shift = self._normalisation(mean, var, x.dtype, centre)
        self._centre = mean.astype(x.dtype, copy=False) if centre else None
        self.save_input(x)
        self._mean, self._invstd, self._batch_stats, self._count = mean, invstd, batch_stats, count
        self.recompute(y)
        return y

    def inference_affine(self, dtype: Any) -> tuple[Any, Any, str | None] | None:
        """(scale, shift, activation) per channel that this op applies in eval mode with running statistics:
        ``activation(x · scale + shift)``, as forward computes them; None where the output depends on the batch
        (training, or ``track_running_stats=False``). See :mod:`neuroflow.folding`."""
        if self.training or not self.track_running_stats:
            return None
        _, scale, shift = self._normalisation(self.running_mean.data, self.running_var.data, dtype)
        return scale, shift, self.activation

    def _normalisation(self, mean: Any, var: Any, dtype: Any, centre: bool = False) -> tuple[Any, Any, Any]:
        """1/√(var + eps), and the per-channel scale and shift (as ``dtype``) that normalise with ``mean`` and
        ``var``: y = x·scale + shift, or y = (x − mean)·scale + shift when ``centre``."""
        invstd = 1.0 / self.xp.sqrt(var + self.eps)
        scale = invstd * self.weight.data if self.affine else invstd
        beta = self.bias.data if self.affine else 0.0
        shift = beta - mean * scale if not centre else self.xp.zeros_like(scale) + beta  # an array without β too
        return invstd, scale.astype(dtype, copy=False), shift.astype(dtype, copy=False)

    def recompute(self, out: Any) -> Any:
        """Write the last forward's output into ``out`` again, bit for bit, from the cached input: one elementwise
        pass, so a parent that needs the output in backward (a convolution's input) can drop it in between."""
        xp, y2, x2 = self.xp, self._view(out), self._view(self.saved_input)
        relu = self.activation == "relu"
        if self._kernels is not None and y2.flags.c_contiguous:
            self._kernels.normalise(x2, self._centre, self._scale, self._shift, relu, y2)
        else:
            scale, shift = self._per_channel(self._scale), self._per_channel(self._shift)
            centre = None if self._centre is None else self._per_channel(self._centre)

            def run(lo: int, hi: int) -> None:
                part = y2[lo:hi]
                if centre is None:
                    xp.multiply(x2[lo:hi], scale, out=part)
                else:  # x·scale would round to ulps of mean·scale, no longer small against the output
                    xp.subtract(x2[lo:hi], centre, out=part)
                    part *= scale
                part += shift
                if relu:
                    xp.maximum(part, 0, out=part)

            self._passes(y2, run, 5 if relu else 3)
        self._y = out if self.activation else None
        return out

    def writes_output_again(self) -> bool:  # recompute(): one pass over the input backward keeps anyway
        return True

    def write_output_again(self) -> Any:
        x = self.saved_input
        if x is None:
            raise RuntimeError(f"{self!r}.write_output_again called before forward")
        return self.recompute(self.buffer("recomputed.output", x.shape, x.dtype))  # the output's shape is x's

    def _batch_statistics(self, x2: Any, spare: Any, count: int,
                          shape: tuple[int, ...]) -> tuple[Any, Any, int, bool]:
        """Per-channel mean and biased variance, the values per channel they are over, and whether the output
        should be computed from the centred input: one pass for Σx and one for Σx² over ``x2`` (summed over the
        ranks when synchronised).

        var = E[x²] − mean² loses digits when the mean dwarfs the spread; then
        (in any channel) the variance and the mean come from a second pass over
        the centred values (written into ``spare``, an array of ``x2``'s
        shape), and the output is normalised from them too. The ranks decide
        that on the same global values, so they all take the second pass or none does.
        """
        xp = self.xp
        if self._kernels is not None:  # in float64: var = E[x²] − mean² keeps its digits far longer
            with Workspace(self, "forward") as ws:
                total, squares = self._kernels.statistics(x2, ws)
        else:
            total, squares = self._sum(x2), self._dot(x2, x2)
        if self._summed is not None:
            (total, squares), count = sum_over_ranks(self, self._summed, total, squares, count=count)
        if count < 2:
            over = " over all ranks" if self._summed is not None else ""
            raise ShapeError(f"{self!r} got input of shape {shape}: training needs more than one value per channel"
                             f"{over}; got {count}")
        mean = total / count
        var = squares / count - mean * mean
        if bool(xp.any(var <= 1e-2 * mean * mean)):
            # the rounded mean is off by a few of its ulps, which are no longer small against the spread: the
            # centred values' own mean corrects it (the corrected two-pass algorithm)
            xp.subtract(x2, self._per_channel(mean), out=spare)
            offset, centred = self._sum(spare), self._dot(spare, spare)
            if self._summed is not None:
                (offset, centred), _ = sum_over_ranks(self, self._summed, offset, centred)
            offset = offset / count
            var = xp.maximum(centred / count - offset * offset, 0)
            return mean + offset, var, count, True
        return mean, var, count, False

    def _update_running(self, mean: Any, var: Any, count: int) -> None:
        self.num_batches_tracked += 1
        m = self.momentum if self.momentum is not None else 1.0 / self.num_batches_tracked
        rm, rv = self.running_mean.data, self.running_var.data
        rm *= 1.0 - m
        rm += m * mean
        rv *= 1.0 - m
        rv += (m * count / (count - 1)) * var

    def backward(self, grad_out: Any) -> Any:
        x = self.saved_input
        if x is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        mean, invstd, batch_stats, y = self._mean, self._invstd, self._batch_stats, self._y
        check_grad(self, grad_out, x.shape)
        xp = self.xp
        # numba's two passes where forward ran them (a gradient in another memory order takes numpy's)
        kernels = self._kernels if batch_stats and grad_out.flags.c_contiguous else None
        with Workspace(self, "backward") as ws:
            g, x2, y2 = grad_out, self._view(x), None if y is None else self._view(y)
            if kernels is not None:
                g2 = self._view(g)
                gbeta, gdot = kernels.gradient_statistics(g2, y2, x2, ws)  # float64, the mask read from y as they go
            else:
                if y is not None:  # fused ReLU: the gradient passes where the output is positive
                    mask = ws("batchnorm.mask", y.shape, bool)
                    g = ws("batchnorm.g", y.shape, y.dtype)

                    def masked(lo: int, hi: int) -> None:
                        xp.greater(y[lo:hi], 0, out=mask[lo:hi])
                        xp.multiply(grad_out[lo:hi], mask[lo:hi], out=g[lo:hi])

                    self._passes(g, masked, 4)
                g2 = self._view(g)
                gbeta, gdot = self._sum(g2), self._dot(g2, x2)
            count = self._count
            gxhat_sum = (gdot - mean * gbeta) * invstd  # Σ g·x̂ per channel
            if self.affine:  # this rank's rows' share: the gradient exchange sums the ranks' shares
                self.accumulate_grad(self.weight, gxhat_sum.astype(x.dtype, copy=False))
                self.accumulate_grad(self.bias, gbeta.astype(x.dtype, copy=False))
            if self._summed is not None:  # every rank's rows moved the statistics: their sums
                (gbeta, gxhat_sum), _ = sum_over_ranks(self, self._summed, gbeta, gxhat_sum)
            gamma = self.weight.data if self.affine else 1.0
            a = gamma * invstd
            gx = self.buffer("gx", x.shape, x.dtype)
            gx2 = self._view(gx)
            if not batch_stats:
                xp.multiply(g2, self._per_channel(a.astype(x.dtype, copy=False)), out=gx2)
                return gx
            # gx = a·(g − mean(g) − x̂·mean(g·x̂)) = a·g + b·x + c per channel
            b = -a * gxhat_sum * invstd / count
            c = -a * gbeta / count - b * mean
            bb, cc = self._per_channel(b.astype(x.dtype, copy=False)), self._per_channel(c.astype(x.dtype, copy=False))
            aa = self._per_channel(a.astype(x.dtype, copy=False))
            if kernels is not None:
                kernels.input_gradient(g2, y2, x2, aa, bb, cc, gx2)
                return gx
            # the masked gradient is our workspace, read for the last time here: scale it in place
            t = g2 if y is not None else ws("batchnorm.t", gx2.shape, x.dtype)

            def combine(lo: int, hi: int) -> None:
                part, tp = gx2[lo:hi], t[lo:hi]
                xp.multiply(x2[lo:hi], bb, out=part)
                part += cc
                xp.multiply(g2[lo:hi], aa, out=tp)
                part += tp

            self._passes(gx2, combine, 8)
            return gx

    # ------------------------------------------------------------------ description
    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, self.num_features, self.layout)
        cached = [shape, shape] if self.activation else [shape]
        workspace = [shape, shape] if self.activation else [shape]
        return MemoryDeclaration(shape, cached=cached, workspace=workspace)

    def layout_options(self) -> LayoutOptions:  # see neuroflow.layout_pass
        return layout_options((self.layout, self.layout), SAME_LAYOUT)

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout)

    def get_config(self) -> dict[str, Any]:
        return {
            "num_features": self.num_features, "eps": self.eps, "momentum": self.momentum, "affine": self.affine,
            "track_running_stats": self.track_running_stats, "activation": self.activation, "layout": self.layout,
        }

    def __repr__(self) -> str:
        return f"BatchNorm2d({self.num_features}{_options_text(self)})"


def sum_over_ranks(bn: BatchNorm2d, summed_over_ranks: Any, *sums: Any, count: int = 0) -> tuple[list[Any], int]:
    """``bn``'s per-channel ``sums`` summed over the ranks by ``summed_over_ranks`` (the ``cross_rank_sum`` its last
    training forward used), as its backend's arrays, and ``count`` summed alike: one float64 vector, one allreduce."""
    backend, c = bn.backend, bn.num_features
    local = np.empty(len(sums) * c + 1)
    for i, part in enumerate(sums):
        local[i * c:(i + 1) * c] = backend.to_host(part)
    local[-1] = count
    summed = np.asarray(summed_over_ranks(local), dtype=np.float64)
    if summed.shape != local.shape:
        raise ShapeError(f"{bn!r}: cross_rank_sum returned shape {summed.shape} for {local.shape}")
    dtype = sums[0].dtype
    parts = [backend.from_host(summed[i * c:(i + 1) * c].astype(dtype)) for i in range(len(sums))]
    return parts, int(round(summed[-1]))


def _options_text(bn: BatchNorm2d) -> str:
    """The arguments of ``bn``'s repr past the channel count: those that differ from the defaults."""
    return "".join((
        f", eps={bn.eps:g}" if not math.isclose(bn.eps, 1e-5) else "",
        f", momentum={bn.momentum}" if bn.momentum != 0.1 else "",
        ", affine=False" if not bn.affine else "",
        ", track_running_stats=False" if not bn.track_running_stats else "",
        f", activation={bn.activation!r}" if bn.activation else "",
        ", NHWC" if bn.layout == "NHWC" else "",
    ))
