"""Matrix products: register-blocked GEMM kernels over strided views (transposes are free), batched.

The kernel is chosen per call from the layout (sources in ``gemm_source``):

- on GPUs, ``tiled`` (local-memory tiles) for every layout;
- on CPUs (pocl), ``rows`` — 8×32 of C in vector registers (8×16 when N < 32; 4 rows with 32-byte vectors), k-blocked when deep — whenever B's rows or A's columns
  are contiguous (the latter by computing Cᵀ = Bᵀ Aᵀ, which only swaps strides); when neither is (x @ W.T),
  B is first copied dense, one extra launch that costs far less than the slower kernels measured here
  (``dots`` along k ran at ~10 GFLOP/s against ~25 for ``rows``); the small leftovers (N < 4) use
  ``dots`` or ``scalar``.

``NEUROFLOW_OPENCL_GEMM=tiled|rows|dots|scalar`` forces a kernel where its layout allows (tests
use it to run the GPU kernel on pocl). pocl runs one work group per task on its worker threads, so
work groups stay small (4 work items) to give both cores work even for a 64-row batch; global sizes
are rounded up to the work-group size and the kernels ignore the extra work items.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow_opencl import gemm_source
from neuroflow_opencl.array import ClArray, empty, is_array
from neuroflow_opencl.elementwise import apply, copy_plan
from neuroflow_opencl.reduction import reduce
from neuroflow_opencl.views import broadcast_shapes, broadcast_strides, collapse

VARIANTS: tuple[str, ...] = ("tiled", "rows", "dots", "scalar")
TILED_GROUP, TILED_PER = 16, 4  # 16×16 work items, 4×4 outputs each: a 64×64 tile of C per work group
GROUP_ITEMS = 4  # work items per work group on CPUs
# On CPUs, products deeper than K_BLOCK walk k in slices, a work-group barrier after each (see rows_source);
# a group is 2 column blocks × 4 row blocks of C. Measured on pocl: the weight gradient of the CNN's second
# convolution (64×5632×288) went from ~17 to ~35 GFLOP/s.
K_BLOCK = 128
# ... when B is larger than this: a B that stays in a core's cache (2 MiB of L2 here) gains nothing from the
# slices, and the MLP's first layer (64×128×784, B 392 KiB) ran 157 -> 128 µs without them.
K_BLOCK_ABOVE_BYTES = 1 << 20
BLOCKED_GROUP = (2, 4)
# Rows of C per work item of ``rows``, by vector width: 2 vectors a row keep half the vector registers in
# accumulators (16 of AVX-512's 32; 8 of AVX2's 16). Measured with the wheel's pocl on AMD Zen 4 (32-byte
# vectors), SGEMM 256x256x256 ran at 38 GFLOP/s with 8 rows (the accumulators spill), 137 with 4.
ROWS = {64: 8, 32: 4}
DEEP_FOR_COPY = 512  # products at least this deep may compute C transposed and copy it (see _transpose)


def matmul(a: ClArray, b: ClArray, out: ClArray | None = None, bias: ClArray | None = None) -> ClArray:
    """``numpy.matmul(a, b, out=out)`` for device arrays of one float dtype; ``bias`` (a vector of the result's
    last dimension) is added to every row, in the GEMM's own launch where its kernel can (``rows``).

    Shapes are checked and the product planned once per layout of the operands: a call then costs one lookup.
    """
    try:
        key = (a.shape, a.estrides, a.dtype, b.shape, b.estrides, b.dtype, a.device,
               None if out is None else (out.shape, out.estrides, out.dtype),
               None if bias is None else (bias.shape, bias.estrides, bias.dtype),
               os.environ.get("NEUROFLOW_OPENCL_GEMM"))
    except AttributeError:
        raise TypeError("matmul on the opencl backend takes device arrays") from None
    call = _CALLS.get(key)
    if call is None:
        call = _CALLS[key] = _call(a, b, out, bias)
    return call(a, b, out, bias)


#: Runs one checked and planned ``matmul``: (a, b, out or None, bias or None) -> out.
Call = Callable[[ClArray, ClArray, "ClArray | None", "ClArray | None"], ClArray]
_CALLS: dict[Any, Call] = {}


def _call(a: ClArray, b: ClArray, out: ClArray | None, bias: ClArray | None) -> Call:
    """``matmul`` for operands laid out as these: shapes checked now, the product planned now where ``out`` is
    given as a matrix."""
    if not (is_array(a) and is_array(b) and (out is None or is_array(out)) and (bias is None or is_array(bias))):
        raise TypeError("matmul on the opencl backend takes device arrays")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: input operand does not have enough dimensions")
    a_shape = (1, a.shape[0]) if a.ndim == 1 else a.shape
    b_shape = (b.shape[0], 1) if b.ndim == 1 else b.shape
    m, k = a_shape[-2:]
    k2, n = b_shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: mismatch in core dimension: {a.shape} @ {b.shape} (size {k} is different from {k2})")
    batch = broadcast_shapes(a_shape[:-2], b_shape[:-2]) if len(a_shape) > 2 or len(b_shape) > 2 else ()
    full = (*batch, m, n)
    shape = full
    if a.ndim == 1:
        shape = (*batch, n)
    if b.ndim == 1:
        shape = (*shape[:-1],) if a.ndim != 1 else tuple(batch)
    dtype = np.result_type(a.dtype, b.dtype)
    if dtype.kind != "f":
        raise TypeError(f"matmul on the opencl backend needs floating-point arrays; got {a.dtype} and {b.dtype}")
    if out is not None and out.shape != shape:
        raise ValueError(f"matmul: output operand has shape {out.shape}; expected {shape}")
    out_dtype = dtype if out is None else out.dtype
    if bias is not None and (bias.shape != (n,) or bias.dtype != out_dtype):
        raise ValueError(f"matmul: bias must be a ({n},) {out_dtype} vector; got {bias.shape} {bias.dtype}")
    if out is not None and a.ndim == b.ndim == 2:  # the hot case (Linear, convolution): no view to make
        plan = _planned(a, b, out, batch, m, n, k, bias)

        def planned(a: ClArray, b: ClArray, out: ClArray | None, bias: ClArray | None) -> ClArray:
            plan(a, b, out, bias)  # type: ignore[arg-type]
            return out  # type: ignore[return-value]

        return planned

    def general(a: ClArray, b: ClArray, out: ClArray | None, bias: ClArray | None) -> ClArray:
        a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
        b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
        if out is None:
            out = empty(a.device, shape, dtype)
        c2 = out.reshape(full) if out.shape != full else out
        _gemm(a2, b2, c2, batch, m, n, k, bias)
        return out

    return general


#: Runs one planned product: (A, B, C, bias or None).
Plan = Callable[[ClArray, ClArray, ClArray, "ClArray | None"], None]
_PLANS: dict[Any, Plan] = {}
#: Runs one planned product with the sums of A's rows: (A, B, C, sums).
SumsPlan = Callable[[ClArray, ClArray, ClArray, ClArray], None]
_SUMS_PLANS: dict[Any, SumsPlan] = {}


def matmul_and_row_sums(a: ClArray, b: ClArray, out: ClArray, sums: ClArray) -> None:
    """``out = a @ b`` and ``sums = a.sum(axis=1)`` for matrices of one float dtype (a Linear layer's weight and
    bias gradients, ``a`` being the output gradient transposed): one launch where the product runs as ``rows``
    in its own orientation into a dense ``out``, else the product and a reduction."""
    if not all(is_array(x) and x.ndim == n for x, n in ((a, 2), (b, 2), (out, 2), (sums, 1))):
        raise ValueError("matmul_and_row_sums takes device matrices a, b, out and a vector sums")
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k or out.shape != (m, n) or sums.shape != (m,):
        raise ValueError(f"matmul_and_row_sums: {a.shape} @ {b.shape} gives ({m}, {n}) and {m} row sums; got out "
                         f"{out.shape} and sums {sums.shape}")
    if len({a.dtype, b.dtype, out.dtype, sums.dtype}) != 1 or out.dtype.kind != "f":
        raise TypeError(f"matmul_and_row_sums needs one float dtype; got {a.dtype}, {b.dtype}, {out.dtype}, "
                        f"{sums.dtype}")
    key = (a.shape, a.estrides, b.shape, b.estrides, out.estrides, sums.estrides, out.dtype, out.device,
           os.environ.get("NEUROFLOW_OPENCL_GEMM"))
    plan = _SUMS_PLANS.get(key)
    if plan is None:
        plan = _SUMS_PLANS[key] = _sums_plan(a, b, out, sums, m, n, k)
    plan(a, b, out, sums)


def _sums_plan(a: ClArray, b: ClArray, c: ClArray, sums: ClArray, m: int, n: int, k: int) -> SumsPlan:
    a_sm, a_sk, b_sk, b_sn, c_sm, c_sn = (1 if size == 1 else s for size, s in zip(
        (m, k, k, n, m, n), (*a.estrides, *b.estrides, *c.estrides), strict=True))
    variant = _variant(c.device, m, n, a_sm, a_sk, b_sk, b_sn)
    if (m and n and variant == "rows" and c_sn == 1 and b_sn == 1 and n >= 4
            and not _transpose(m, n, k, a_sm == 1 and m >= 4, True, (c_sm, c_sn), c.device.vector_bytes // c.dtype.itemsize)):
        return _launch(variant, (a_sm, a_sk, ()), (b_sk, b_sn, ()), (c_sm, c_sn, ()), c.dtype, a.dtype, b.dtype,
                       1, m, n, k, None, "row", c.device, sums.estrides[0])

    def product_then_sums(a: ClArray, b: ClArray, c: ClArray, sums: ClArray) -> None:
        matmul(a, b, out=c)
        reduce("sum", a, axis=1, out=sums)

    return product_then_sums


def _gemm(a: ClArray, b: ClArray, c: ClArray, batch: tuple[int, ...], m: int, n: int, k: int,
          bias: ClArray | None = None) -> None:
    """C = A @ B (+ bias) through a plan made once per layout: the choices below cost more Python than a launch."""
    _planned(a, b, c, batch, m, n, k, bias)(a, b, c, bias)


def _planned(a: ClArray, b: ClArray, c: ClArray, batch: tuple[int, ...], m: int, n: int, k: int,
             bias: ClArray | None) -> Plan:
    """The plan for operands laid out as these (made on first use)."""
    if m == 0 or n == 0:
        return _nothing
    key = (a.shape, a.estrides, b.shape, b.estrides, c.estrides, batch, c.dtype, a.dtype, b.dtype,
           None if bias is None else bias.estrides, c.device, os.environ.get("NEUROFLOW_OPENCL_GEMM"))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(a, b, c, batch, m, n, k, bias)
    return plan


def _nothing(a: ClArray, b: ClArray, c: ClArray, bias: ClArray | None) -> None:
    """The plan of an empty product."""


def _plan(a: ClArray, b: ClArray, c: ClArray, batch: tuple[int, ...], m: int, n: int, k: int,
          bias: ClArray | None) -> Plan:
    sa = broadcast_strides(a.shape[:-2], a.estrides[:-2], batch)
    sb = broadcast_strides(b.shape[:-2], b.estrides[:-2], batch)
    bshape, (bsa, bsb, bsc) = collapse(batch, [sa, sb, c.estrides[:-2]])
    if len(bshape) > 1 or (bias is not None and bshape):  # batch axes that no single stride can walk
        def per_batch(a: ClArray, b: ClArray, c: ClArray, bias: ClArray | None) -> None:
            for i in range(batch[0]):
                _gemm(_slice(a, batch, sa, i), _slice(b, batch, sb, i), c[i], batch[1:], m, n, k, bias)

        return per_batch
    # A stride along a length-1 axis never moves; calling it 1 lets more calls take the vector kernels.
    a_sm, a_sk, b_sk, b_sn, c_sm, c_sn = (1 if size == 1 else s for size, s in zip(
        (m, k, k, n, m, n), (*a.estrides[-2:], *b.estrides[-2:], *c.estrides[-2:]), strict=True))
    variant = _variant(c.device, m, n, a_sm, a_sk, b_sk, b_sn)
    if variant == "pack":
        if b.ndim != 2:
            return lambda a, b, c, bias: _gemm(a, b.copy(), c, batch, m, n, k, bias)
        dense = b.view_at(0, (k, n), (n, 1))  # the layout of the copy (a plan reads layouts only)
        copy, product = copy_plan(dense, b), _planned(a, dense, c, batch, m, n, k, bias)

        def pack(a: ClArray, b: ClArray, c: ClArray, bias: ClArray | None) -> None:
            packed = empty(c.device, (k, n), b.dtype)
            copy.launch(packed, (b,))
            product(a, packed, c, bias)

        return pack
    transpose = variant == "rows" and _transpose(m, n, k, a_sm == 1 and m >= 4, b_sn == 1 and n >= 4,
                                                 (c_sm, c_sn), c.device.vector_bytes // c.dtype.itemsize)
    if variant == "rows" and not bshape and (c_sm if transpose else c_sn) != 1:
        # Measured on pocl: the kernel runs up to 1.4× slower when its rows of C are strided (a transposed
        # weight gradient); a dense product and one copy cost less.
        def dense_then_copy(a: ClArray, b: ClArray, c: ClArray, bias: ClArray | None) -> None:
            dense = empty(c.device, (n, m) if transpose else (m, n), c.dtype)
            _gemm(a, b, dense.T if transpose else dense, batch, m, n, k, bias)
            apply("copy", dense.T if transpose else dense, out=c)

        return dense_then_copy
    nb = bshape[0] if bshape else 1
    bias_stride = None if bias is None else bias.estrides[0]
    if transpose:
        launch = _launch(variant, (b_sn, b_sk, bsb), (a_sk, a_sm, bsa), (c_sn, c_sm, bsc), c.dtype, b.dtype, a.dtype,
                         nb, n, m, k, bias_stride, "column", c.device)
        return lambda a, b, c, bias: launch(b, a, c, bias)
    return _launch(variant, (a_sm, a_sk, bsa), (b_sk, b_sn, bsb), (c_sm, c_sn, bsc), c.dtype, a.dtype, b.dtype,
                   nb, m, n, k, bias_stride, "row", c.device)


def _transpose(m: int, n: int, k: int, a_cols: bool, b_rows: bool, c_strides: tuple[int, int], lanes: int) -> bool:
    """Whether ``rows`` should compute Cᵀ = Bᵀ Aᵀ (B's transpose has the contiguous rows when A's columns are).

    When both ways work, the one whose column blocks cover C's width with less overlap, then the narrower
    one: measured on pocl, a convolution's weight gradient (64×5632×288) ran 1.3× faster as 288×5632×64.
    A way that writes C's rows strided takes a dense product and a copy of C, worth it only for deep
    products: the MLP's first weight gradient (128×64×784) took 432 µs as it is, 450 + 123 µs transposed.
    """
    if not (a_cols and b_rows):
        return not b_rows
    c_sm, c_sn = c_strides
    if k < DEEP_FOR_COPY and (c_sm == 1) != (c_sn == 1):
        return c_sm == 1

    def covered(width: int) -> float:  # the fraction of computed columns that are C's own
        span = next((w for w in (2 * lanes, lanes, 8, 4) if w <= width), width)
        return width / (math.ceil(width / span) * span)

    return (covered(m), -m) > (covered(n), -n)


def _variant(device: Any, m: int, n: int, a_sm: int, a_sk: int, b_sk: int, b_sn: int) -> str:
    """The kernel for this layout on ``device``: forced by NEUROFLOW_OPENCL_GEMM where the layout allows."""
    forced = os.environ.get("NEUROFLOW_OPENCL_GEMM")
    if forced is not None and forced not in VARIANTS:
        raise ValueError(f"NEUROFLOW_OPENCL_GEMM={forced!r}; expected one of {', '.join(VARIANTS)}")
    if forced == "tiled" or (forced is None and device.facts.kind == "gpu"):
        return "tiled"
    dots = a_sk == 1 and b_sk == 1
    if forced == "dots" and dots:
        return "dots"
    if forced == "scalar":
        return "scalar"
    if (b_sn == 1 and n >= 4) or (a_sm == 1 and m >= 4):
        return "rows"
    if n >= 4 and m >= 4:
        return "pack"
    return "dots" if dots else "scalar"


def _launch(variant: str, a_layout: tuple[int, int, tuple[int, ...]], b_layout: tuple[int, int, tuple[int, ...]],
            c_layout: tuple[int, int, tuple[int, ...]], out_dtype: np.dtype, a_dtype: np.dtype, b_dtype: np.dtype,
            nb: int, m: int, n: int, k: int, bias_stride: int | None, bias_along: str, device: Any,
            sums_stride: int | None = None) -> Any:
    """The launch of one kernel for this layout; ``bias_along`` says whether a bias (of stride ``bias_stride``)
    runs along C's rows (one value per column) or its columns (one per row, when C is computed transposed).
    With ``sums_stride`` (``rows`` only) the launch is a ``SumsPlan``, else a ``Plan``."""
    (a_sm, a_sk, bsa), (b_sk, b_sn, bsb), (c_sm, c_sn, bsc) = a_layout, b_layout, c_layout
    strides = (a_sm, a_sk, b_sk, b_sn, c_sm, c_sn)
    dtypes = (out_dtype, a_dtype, b_dtype)
    unit = tuple(s == 1 for s in strides)
    batch_strides = tuple(s[0] if s else 0 for s in (bsa, bsb, bsc))
    local: tuple[int, int, int] | None
    fused_bias = bias_stride is not None and variant == "rows"
    if variant == "tiled":
        source = gemm_source.tiled_source(*dtypes, unit, TILED_GROUP, TILED_PER)
        tile = TILED_GROUP * TILED_PER
        local = (TILED_GROUP, TILED_GROUP, 1)
        size = (math.ceil(n / tile) * TILED_GROUP, math.ceil(m / tile) * TILED_GROUP, nb)
    else:
        lanes = device.vector_bytes // out_dtype.itemsize  # one vector register (AVX-512's where there is one)
        k_block = 0
        if variant == "rows":
            rows = min(ROWS.get(device.vector_bytes, 8), m)  # whole row blocks only: a GEMV (one row) computes one row, not eight
            width = next(w for w in (lanes, 8, 4) if w <= n)
            vectors = 2 if n >= 2 * width else 1  # 8 × 2 accumulators: half of AVX-512's 32 registers
            k_block = K_BLOCK if k > K_BLOCK and k * n * b_dtype.itemsize > K_BLOCK_ABOVE_BYTES else 0
            fixed = (*strides, *batch_strides, m, n, k, *((bias_stride,) if fused_bias else ()),
                     *((sums_stride,) if sums_stride is not None else ()))
            source = gemm_source.rows_source(*dtypes, rows, width, vectors, k_block, bias_along if fused_bias else "",
                                             fixed=fixed, sums=sums_stride is not None)
            cols = width * vectors
        elif variant == "dots":
            rows, cols = min(4, 1 << (m - 1).bit_length()), min(4, 1 << (n - 1).bit_length())
            source = gemm_source.dots_source(*dtypes, unit, rows, cols, lanes)
        else:
            rows = cols = 4
            source = gemm_source.scalar_source(*dtypes, unit, rows, cols)
        if k_block:
            size, local = _blocked_sizes(math.ceil(n / cols), math.ceil(m / rows), nb, device.facts.compute_units)
        else:
            size, local = _cpu_sizes(math.ceil(n / cols), math.ceil(m / rows), nb)
    if variant == "rows":
        kernel = device.kernel(source, "gemm")
        extra = int(fused_bias or sums_stride is not None)  # never both: a bias is Linear's forward, sums its backward
        kernel.set_scalar_arg_dtypes([None] * (3 + extra) + [np.int64] * (3 + extra))
        queue = device.queue
        if sums_stride is not None:
            return lambda a, b, c, sums: kernel(queue, size, local, a.buffer, b.buffer, c.buffer, sums.buffer,
                                                a.offset, b.offset, c.offset, sums.offset)
        if fused_bias:
            return lambda a, b, c, bias: kernel(queue, size, local, a.buffer, b.buffer, c.buffer, bias.buffer,  # type: ignore[union-attr]
                                                a.offset, b.offset, c.offset, bias.offset)  # type: ignore[union-attr]
        return lambda a, b, c, bias: kernel(queue, size, local, a.buffer, b.buffer, c.buffer, a.offset, b.offset,
                                            c.offset)
    tail = (*strides, *batch_strides, m, n, k)

    def launch(a: ClArray, b: ClArray, c: ClArray, bias: ClArray | None) -> None:
        device = c.device
        params = device.constants((a.offset, b.offset, c.offset, *tail))
        device.kernel(source, "gemm")(device.queue, size, local, a.buffer, b.buffer, c.buffer, params)
        if bias is not None:  # C is the caller's own (m, n) view here, whichever way it was computed
            apply("add", c, bias, out=c)

    return launch


def _cpu_sizes(gx: int, gy: int, nb: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Global and local sizes: ``GROUP_ITEMS`` work items per group, along columns first (they share A's rows)."""
    lx = min(GROUP_ITEMS, 1 << (gx.bit_length() - 1))
    ly = min(GROUP_ITEMS // lx, 1 << (gy.bit_length() - 1))
    return (math.ceil(gx / lx) * lx, math.ceil(gy / ly) * ly, nb), (lx, ly, 1)


def _blocked_sizes(gx: int, gy: int, nb: int, units: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Global and local sizes for the k-blocked ``rows`` kernel: groups of ``BLOCKED_GROUP`` work items that
    share k-slices in cache, made smaller while there are too few groups to keep every core busy."""
    lx, ly = min(BLOCKED_GROUP[0], gx), min(BLOCKED_GROUP[1], gy)
    while ly > 1 and math.ceil(gx / lx) * math.ceil(gy / ly) * nb < 2 * units:
        ly //= 2
    if lx > 1 and math.ceil(gx / lx) * gy * nb < 2 * units:
        lx = 1
    return (math.ceil(gx / lx) * lx, math.ceil(gy / ly) * ly, nb), (lx, ly, 1)


def _slice(x: ClArray, batch: tuple[int, ...], strides: tuple[int, ...], i: int) -> ClArray:
    """Index ``i`` along the first batch axis of ``x`` broadcast to ``batch`` (``strides``: its batch strides)."""
    return x.view_at(x.offset + i * strides[0], (*batch[1:], *x.shape[-2:]), (*strides[1:], *x.estrides[-2:]))
