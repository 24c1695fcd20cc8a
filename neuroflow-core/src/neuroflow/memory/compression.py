"""Sparse gradient compression with error feedback: what an optimisation step sends, per layer.

At the end of each optimisation step (after all micro-batches have been
accumulated into the flat gradient) the compressor adds the step's gradient
to a residual, keeps per layer only the entries worth sending (the top-k by
magnitude, or those above a threshold) in the flat gradient that the
optimizer reads, and leaves the rest in the residual for the next step
(error feedback). Every entry goes either to the update or to the residual,
never to both, so ``sent + residual_after == residual_before + gradient``
holds exactly, entry by entry: nothing is lost, only delayed.

What it saves, measured in ``benchmarks/compression.py``: the update a step
sends is ``nnz × (index + value)`` bytes instead of ``size × value``; at 10 %
that is a fifth of a dense gradient, which matters wherever the update
crosses a link (an offloaded host optimizer, several devices). What it
costs: on one device it saves no memory; it adds a dense residual the size
of the gradients (:func:`compression_nbytes`), because exact error feedback
has to keep every unsent entry, and the optimizer reads a dense gradient.

It compresses once per optimisation step rather than per micro-batch: the
micro-batches add up on the device anyway, and one update per step sends k
entries where one per micro-batch would send k per micro-batch. For the same
reason it works without accumulation too: the residual carries over steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ConfigError

MODES = ("topk", "threshold", "auto")
DEFAULT_RATIO = 0.1
#: ``"auto"`` compresses a layer whose top-k entries hold at least this share of its step gradient's squared norm.
AUTO_MIN_ENERGY = 0.6
INDEX_BYTES = 4  # int32 positions within one layer; layers of 2**31 entries and more need 8


@dataclass
class LayerStats:
    """What one layer sent in the last step: ``mode`` "sparse" or "dense", ``sent`` non-zero entries.

    ``energy`` is the share of the step gradient's squared norm that the layer's top-k
    entries hold (the sparsity ``"auto"`` measures); NaN where not measured.
    """

    name: str
    size: int
    mode: str
    sent: int
    energy: float

    def sent_bytes(self, itemsize: int) -> int:
        """Bytes this layer's update takes on the wire: (index, value) pairs when sparse, the array when dense."""
        if self.mode == "dense":
            return self.size * itemsize
        return self.sent * (itemsize + (INDEX_BYTES if self.size < 2**31 else 8))


class GradientCompressor:
    """Top-k / threshold / auto sparsification of the flat gradient with an exact error-feedback residual.

    ``mode="topk"`` sends, per layer, the ``ceil(ratio × size)`` entries of
    largest magnitude (entries tied with the k-th go too); ``"threshold"``
    sends the entries with ``|g| >= threshold``; ``"auto"`` measures each
    layer every step and sends its top-k when they hold at least
    ``min_energy`` of the squared norm of the layer's gradient in this step (a
    sparse layer), else the whole layer (a dense layer, whose residual then
    empties).

    Example::

        compressor = GradientCompressor("topk", ratio=0.1)
        compressor.bind(flat, names)
        compressor.compress(flat.grad)      # flat.grad now holds what is sent
    """

    def __init__(
        self, mode: str, *, ratio: float | None = None, threshold: float | None = None,
        min_energy: float = AUTO_MIN_ENERGY,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown gradient_compression {mode!r}; choose one of {', '.join(map(repr, MODES))} "
                              "or None (dense accumulation, the default)")
        if mode == "threshold":
            if ratio is not None:
                raise ConfigError("compression_ratio applies to gradient_compression 'topk' and 'auto'; "
                                  f"'threshold' sends entries with |g| >= compression_threshold (got ratio {ratio!r})")
            if threshold is None:
                raise ConfigError("gradient_compression='threshold' needs compression_threshold: the smallest "
                                  "magnitude sent, e.g. 1e-3")
            if isinstance(threshold, bool) or not (isinstance(threshold, int | float) and math.isfinite(threshold) and threshold > 0):
                raise ConfigError(f"compression_threshold must be a finite number > 0; got {threshold!r}")
        else:
            if threshold is not None:
                raise ConfigError(f"compression_threshold applies to gradient_compression='threshold'; the mode is "
                                  f"{mode!r}, which keeps a fraction: set compression_ratio instead")
            ratio = DEFAULT_RATIO if ratio is None else ratio
            if isinstance(ratio, bool) or not (isinstance(ratio, int | float) and 0 < ratio <= 1):
                raise ConfigError(f"compression_ratio must be in (0, 1], the fraction of each layer sent per step; "
                                  f"got {ratio!r} (0.1 sends 10 %)")
        if not 0 < min_energy <= 1:
            raise ConfigError(f"min_energy must be in (0, 1]; got {min_energy!r}")
        self.mode = mode
        self.ratio = None if ratio is None else float(ratio)
        self.threshold = None if threshold is None else float(threshold)
        self.min_energy = float(min_energy)
        self.residual: Any = None
        self.slices: list[slice] = []
        self.names: list[str] = []
        self.last_stats: list[LayerStats] = []
        self._xp: Any = None
        self._pending: Any = None

    def bind(self, flat: Any, names: list[str] | None = None) -> None:
        """Allocate the residual for ``flat``'s layers (a FlatParameters); it starts at zero."""
        xp = array_namespace(flat.grad)
        self._xp = xp
        self.slices = list(flat.slices)
        self.names = list(names) if names is not None else [f"param{i}" for i in range(len(self.slices))]
        if len(self.names) != len(self.slices):
            raise ValueError(f"bind got {len(self.names)} names for {len(self.slices)} parameters")
        self.residual = xp.zeros(flat.grad.shape, dtype=flat.grad.dtype)
        pending, self._pending = self._pending, None
        if pending is not None:
            self.load_residual(pending)

    def load_residual(self, residual: Any) -> None:
        """Restore a checkpoint's residual (a host array); before ``bind`` it is kept until then."""
        if self.residual is None:
            self._pending = residual
            return
        if tuple(residual.shape) != tuple(self.residual.shape):
            raise ValueError(f"the saved gradient-compression residual has shape {tuple(residual.shape)}; "
                             f"the model's trainable parameters need {tuple(self.residual.shape)}")
        self.residual[...] = self._xp.asarray(residual.astype(self.residual.dtype, copy=False))

    @property
    def nbytes(self) -> int:
        """Memory the compressor holds beyond dense accumulation: the residual."""
        return 0 if self.residual is None else int(self.residual.nbytes)

    def compress(self, grad: Any) -> list[LayerStats]:
        """Add ``grad`` (the step's flat gradient) to the residual; leave in ``grad`` only what is sent.

        Allocates no array and needs no scratch: once a layer's gradient is
        in the residual, its slice of ``grad`` holds magnitudes and the selection.
        Gradients must be finite (the Trainer stops at a non-finite loss before).
        """
        if self.residual is None:
            raise RuntimeError("GradientCompressor.compress before bind(flat): nothing to keep the residual in")
        if grad.shape != self.residual.shape:
            raise ValueError(f"compress got a gradient of shape {tuple(grad.shape)}; bound to {tuple(self.residual.shape)}")
        xp = self._xp
        stats = []
        for name, view in zip(self.names, self.slices):
            pending, out = self.residual[view], grad[view]
            size = view.stop - view.start
            k = 0 if self.ratio is None else max(1, math.ceil(self.ratio * size))
            pending += out
            # From here ``out`` is free: it serves as the scratch, so the residual is all the memory this costs.
            energy = math.nan
            if self.mode == "auto":
                # Measured on this step's gradient, not on the pending sum: the residual spreads
                # energy over many small entries, so it would call every layer dense after a while.
                energy = _top_energy(xp, out, k)
            if energy < self.min_energy:  # False for NaN: only "auto" measures
                out[...] = pending  # a dense layer: send everything, its residual empties
                pending.fill(0)
                stats.append(LayerStats(name, size, "dense", int(xp.count_nonzero(out)), energy))
                continue
            if self.mode == "threshold":
                bound = self.threshold
            else:
                xp.abs(pending, out=out)
                out.partition(size - k)  # in place: the k largest magnitudes end up last
                bound = float(out[size - k])
            xp.abs(pending, out=out)
            xp.greater_equal(out, bound, out=out)  # 1.0 where sent, 0.0 where held back
            # Both are exact for finite values: x * 1 == x, x * 0 == 0, x - x == 0 and x - 0 == x,
            # so each entry lands whole in exactly one of the update and the residual.
            out *= pending
            pending -= out
            stats.append(LayerStats(name, size, "sparse", int(xp.count_nonzero(out)), energy))
        self.last_stats = stats
        return stats

    def sent_bytes(self, itemsize: int) -> int:
        """Bytes the last step's update takes as (index, value) pairs for sparse layers and arrays for dense ones."""
        return sum(s.sent_bytes(itemsize) for s in self.last_stats)

    def packed(self, grad: Any) -> list[tuple[str, Any, Any]]:
        """The last update as ``(name, indices, values)`` per layer: what would cross a link.

        Dense layers come with ``indices=None`` and the whole array.
        """
        xp = array_namespace(grad)
        parts = []
        for stat, view in zip(self.last_stats, self.slices):
            layer = grad[view]
            if stat.mode == "dense":
                parts.append((stat.name, None, layer.copy()))
            else:
                index = xp.flatnonzero(layer).astype(xp.int32 if stat.size < 2**31 else xp.int64)
                parts.append((stat.name, index, layer[index]))
        return parts

    def __repr__(self) -> str:
        setting = f"threshold={self.threshold}" if self.mode == "threshold" else f"ratio={self.ratio}"
        return f"GradientCompressor({self.mode!r}, {setting})"


def build_compressor(
    mode: str | GradientCompressor | None, ratio: float | None = None, threshold: float | None = None
) -> GradientCompressor | None:
    """The compressor for the Trainer's ``gradient_compression``, ``compression_ratio``, ``compression_threshold``.

    None means dense accumulation (the default); a GradientCompressor is used as given.
    """
    if isinstance(mode, GradientCompressor):
        if ratio is not None or threshold is not None:
            raise ConfigError(f"gradient_compression={mode!r} carries its own settings; "
                              "drop compression_ratio and compression_threshold")
        return mode
    if mode is None:
        if ratio is not None or threshold is not None:
            raise ConfigError("compression_ratio and compression_threshold need gradient_compression "
                              "('topk', 'threshold' or 'auto'); it is None")
        return None
    return GradientCompressor(mode, ratio=ratio, threshold=threshold)


def compression_nbytes(sizes: list[int], itemsize: int) -> int:
    """Memory a GradientCompressor adds for layers of ``sizes`` entries: the residual."""
    return sum(sizes) * itemsize


def _top_energy(xp: Any, layer: Any, k: int) -> float:
    """The share of ``layer``'s squared norm held by its ``k`` largest entries (1.0 for a zero layer); overwrites it."""
    size = layer.size
    xp.abs(layer, out=layer)
    layer.partition(size - k)
    top = layer[size - k:]
    total = float(xp.dot(layer, layer))
    return float(xp.dot(top, top)) / total if total > 0 else 1.0
