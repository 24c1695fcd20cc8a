"""Sliding windows over feature maps: output sizes, padding, im2col, and per-tap slices.

A "tap" is one kernel offset (i, j). Convolution and pooling loop over taps
where a strided slice per tap is the fast path on numpy (col2im as adds of
strided slices beats ``np.add.at`` by 7×); im2col itself is one copy out of a
strided window view when the namespace has ``as_strided``, a loop over taps
otherwise.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroflow.backends.cpu_parallel import copyto
from neuroflow.errors import ShapeError


def pair(value: int | tuple[int, int] | list[int], name: str, owner: str, minimum: int = 1) -> tuple[int, int]:
    """``value`` as an (h, w) pair of ints ≥ ``minimum``; a ValueError naming ``owner`` otherwise."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    try:
        if len(items) != 2 or any(isinstance(v, bool) for v in items):
            raise TypeError
        h, w = (operator.index(v) for v in items)  # ints, numpy ints; not floats
    except TypeError:
        raise ValueError(f"{owner}: {name} must be an int or a pair of ints; got {value!r}") from None
    if min(h, w) < minimum:
        raise ValueError(f"{owner}: {name} must be ≥ {minimum}; got {value!r}")
    return (h, w)


def pair_text(value: tuple[int, int]) -> str:
    """``3`` for (3, 3), ``2×3`` otherwise: how reprs show kernel sizes and strides."""
    return str(value[0]) if value[0] == value[1] else f"{value[0]}×{value[1]}"


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1, ceil_mode: bool = False) -> int:
    """Output length of a window sweep along one axis, as PyTorch computes it (≤ 0 when it does not fit)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    if span < 0:
        return 0
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def check_fits(owner: Any, shape: tuple[int, ...], hw: tuple[int, int], out_hw: tuple[int, int],
               kernel: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int] = (1, 1)) -> None:
    """Raise ShapeError naming ``owner`` when the (padded) map is smaller than the kernel's reach."""
    if min(out_hw) <= 0:
        reach = (dilation[0] * (kernel[0] - 1) + 1, dilation[1] * (kernel[1] - 1) + 1)
        raise ShapeError(
            f"{owner!r} got input of shape {tuple(shape)}: the {hw[0]}×{hw[1]} map with padding "
            f"{padding[0]}×{padding[1]} is smaller than the kernel's {reach[0]}×{reach[1]} reach"
        )


@dataclass(frozen=True)
class Geometry:
    """Kernel, stride, padding and dilation of a window sweep over (H, W)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False

    def out_hw(self, hw: tuple[int, int]) -> tuple[int, int]:
        return (
            output_size(hw[0], self.kernel[0], self.stride[0], self.padding[0], self.dilation[0], self.ceil_mode),
            output_size(hw[1], self.kernel[1], self.stride[1], self.padding[1], self.dilation[1], self.ceil_mode),
        )

    def padded_hw(self, out_hw: tuple[int, int]) -> tuple[int, int]:
        """Rows and columns of the padded map the sweep reads (ceil_mode may read past the right padding)."""
        return (
            self.stride[0] * (out_hw[0] - 1) + self.dilation[0] * (self.kernel[0] - 1) + 1,
            self.stride[1] * (out_hw[1] - 1) + self.dilation[1] * (self.kernel[1] - 1) + 1,
        )

    @property
    def pointwise(self) -> bool:
        """A 1×1, stride-1, unpadded sweep: the map itself is the column matrix."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)

    def taps(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def rows(self, i: int, count: int) -> slice:
        return tap(i, self.dilation[0], self.stride[0], count)

    def cols(self, j: int, count: int) -> slice:
        return tap(j, self.dilation[1], self.stride[1], count)

    def clipped(self, i: int, j: int, hw: tuple[int, int], out_hw: tuple[int, int]) -> tuple[slice, slice, slice, slice] | None:
        """(out rows, out cols, in rows, in cols) of tap (i, j) on the unpadded map; None if it reads only padding."""
        r = clipped_tap(i, self.dilation[0], self.stride[0], self.padding[0], hw[0], out_hw[0])
        c = clipped_tap(j, self.dilation[1], self.stride[1], self.padding[1], hw[1], out_hw[1])
        if r is None or c is None:
            return None
        return r[0], c[0], r[1], c[1]


def tap(index: int, dilation: int, stride: int, count: int) -> slice:
    """The slice of a padded axis read by tap ``index`` for ``count`` outputs."""
    start = index * dilation
    return slice(start, start + stride * (count - 1) + 1, stride)


def clipped_tap(index: int, dilation: int, stride: int, padding: int, size: int, count: int) -> tuple[slice, slice] | None:
    """(output slice, input slice) of tap ``index`` on an unpadded axis, or None when it reads only padding."""
    offset = index * dilation - padding  # input position read by output 0
    first = 0 if offset >= 0 else (-offset + stride - 1) // stride
    last = min(count, (size - 1 - offset) // stride + 1) if offset <= size - 1 else 0
    if last <= first:
        return None
    start = first * stride + offset
    return slice(first, last), slice(start, start + stride * (last - first - 1) + 1, stride)


def pad_into(x: Any, offset: tuple[int, int], out: Any, fill: float = 0.0, layout: str = "NHWC") -> Any:
    """Copy the map ``x`` into ``out`` at spatial ``offset`` and set the rest of ``out`` to ``fill``."""
    (ph, pw), (h, w) = offset, spatial_shape(x.shape, layout)
    every = slice(None)
    for rows, cols in ((slice(0, ph), every), (slice(ph + h, None), every),
                       (slice(ph, ph + h), slice(0, pw)), (slice(ph, ph + h), slice(pw + w, None))):
        out[spatial_index(layout, rows, cols)] = fill
    out[spatial_index(layout, slice(ph, ph + h), slice(pw, pw + w))] = x
    return out


def spatial_shape(shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    """(H, W) of a 4-d shape in ``layout``."""
    return (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])


def window_view(xp: Any, xpad: Any, geo: Geometry, out_hw: tuple[int, int], groups: int) -> Any | None:
    """A (N, Ho, Wo, G, kh, kw, C/G) strided view of the padded NHWC map; None without ``as_strided``."""
    strided = getattr(getattr(getattr(xp, "lib", None), "stride_tricks", None), "as_strided", None)
    if strided is None or not xpad.flags.c_contiguous:
        return None
    n, _, _, c = xpad.shape
    sn, sh, sw, sc = xpad.strides
    cg = c // groups
    shape = (n, out_hw[0], out_hw[1], groups, geo.kernel[0], geo.kernel[1], cg)
    strides = (sn, sh * geo.stride[0], sw * geo.stride[1], sc * cg, sh * geo.dilation[0], sw * geo.dilation[1], sc)
    return strided(xpad, shape=shape, strides=strides, writeable=False)


def im2col(xp: Any, xpad: Any, geo: Geometry, out_hw: tuple[int, int], groups: int, col: Any) -> Any:
    """Fill ``col`` (N, Ho, Wo, G, kh, kw, C/G) with the windows of the padded NHWC map ``xpad``."""
    view = window_view(xp, xpad, geo, out_hw, groups)
    if view is not None:
        if xp is np:  # a plain copy: split over the batch between the cores (neuroflow.backends.cpu_parallel)
            copyto(col, view)
        else:
            xp.copyto(col, view)
        return col
    n, _, _, c = xpad.shape
    for i, j in geo.taps():
        window = xpad[:, geo.rows(i, out_hw[0]), geo.cols(j, out_hw[1]), :]
        col[:, :, :, :, i, j, :] = window.reshape(n, out_hw[0], out_hw[1], groups, c // groups)
    return col


def spatial_index(layout: str, rows: slice, cols: slice) -> tuple[slice, ...]:
    """An index that applies ``rows`` and ``cols`` to the spatial axes of a 4-d map in ``layout``."""
    every = slice(None)
    if layout == "NCHW":
        return (every, every, rows, cols)
    return (every, rows, cols, every)
