"""Convolution as im2col + GEMM on NHWC maps, chunked over the batch.

Forward: the windows of a chunk are copied into a column matrix
(rows = output pixels, columns = kh·kw·C/G in (i, j, c) order, contiguous in
c) and multiplied by the weight matrix in one GEMM per group.

Backward of a stride-1 sweep: the input gradient is itself a stride-1
convolution, of the output gradient with the spatially flipped, transposed
kernel: columns of the gradient and one GEMM (measured on ResNet-18's 3×3
layers: 0.6–0.8× the time of the per-tap method, except at 4×4 maps where
they tie). The same columns, transposed, times the input give the weight
gradient with its taps flipped, so one im2col (of the gradient) serves both.
Other sweeps take the weight gradient as one GEMM against the input's columns
(rebuilt per chunk unless the forward kept them), and the input gradient as
one GEMM per tap whose result is added into a strided slice of the gradient,
which is col2im without ``add.at`` and without a column-sized buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuroflow.backends import blas_threads
from neuroflow_ops_vision.windows import Geometry, im2col, pad_into
from neuroflow_ops_vision.workspace import Workspace

#: Bytes of kernel a slab of :func:`flip` reads (16 output channels of a 3×3, 512-channel kernel).
FLIP_SLAB_BYTES = 2**18


def column_shape(n: int, out_hw: tuple[int, int], geo: Geometry, groups: int, channels: int) -> tuple[int, ...]:
    """Shape of the column buffer for ``n`` samples: (N, Ho, Wo, G, kh, kw, C/G)."""
    return (n, out_hw[0], out_hw[1], groups, geo.kernel[0], geo.kernel[1], channels // groups)


def padded_shape(x_shape: tuple[int, ...], geo: Geometry) -> tuple[int, int, int, int]:
    n, h, w, c = x_shape
    return (n, h + 2 * geo.padding[0], w + 2 * geo.padding[1], c)


def columns(ws: Workspace, x: Any, geo: Geometry, out_hw: tuple[int, int], groups: int, into: Any = None) -> Any:
    """The (rows, G, K/G) column matrix of the NHWC chunk ``x``; a view of ``x`` for pointwise sweeps."""
    n, _, _, c = x.shape
    rows = n * out_hw[0] * out_hw[1]
    if geo.pointwise:
        return x.reshape(rows, groups, c // groups)
    source = x
    if geo.padding != (0, 0):
        source = pad_into(x, geo.padding, ws("conv.xpad", padded_shape(x.shape, geo), x.dtype))
    col = into if into is not None else ws("conv.col", column_shape(n, out_hw, geo, groups, c), x.dtype)
    im2col(ws.xp, source, geo, out_hw, groups, col)
    return col.reshape(rows, groups, -1)


def forward(ws: Workspace, x: Any, wmat: Any, y: Any, geo: Geometry, groups: int, chunk: int, keep: Any = None) -> Any:
    """y = conv(x) for NHWC ``x`` (N, H, W, C) and ``wmat`` (O, kh, kw, C/G); returns the columns if kept.

    ``keep`` is an op-owned column buffer for the whole batch (one chunk):
    the columns stay valid for backward. Otherwise they live in a workspace.
    """
    xp = ws.xp
    n = x.shape[0]
    out_hw = (y.shape[1], y.shape[2])
    o = y.shape[3]
    og = o // groups
    cols = None
    for n0 in range(0, n, chunk):
        cols = columns(ws, x[n0:n0 + chunk], geo, out_hw, groups, keep)
        ys = y[n0:n0 + chunk].reshape(-1, o)
        for g in range(groups):
            blas_threads.matmul(xp, cols[:, g], wmat[g * og:(g + 1) * og].reshape(og, -1).T, out=ys[:, g * og:(g + 1) * og])
    return cols if keep is not None else None


def backward(ws: Workspace, x: Any, grad: Any, weight_matrix: Callable[[Workspace], Any],
             weight_gradient: Callable[[], Any] | None, gx: Any | None, geo: Geometry, groups: int, chunk: int,
             kept: Any, grad_chunk: int, flipped_weight: Callable[[Workspace], Any]) -> None:
    """Write the weight gradient into ``weight_gradient()`` (O, kh, kw, C/G) and the input gradient into
    ``gx``; None skips either.

    The weight gradient's array is asked for once, as late as it can be: a
    workspace the caller takes then can share memory with the columns
    already retired. It may be strided (the parameter's gradient,
    transposed): each chunk's GEMM goes into one contiguous workspace and is
    copied or added from there.
    A stride-1 sweep with an input gradient takes both from the output
    gradient's columns (:func:`takes_gradient_columns`), in batch chunks of
    ``grad_chunk``, with the kernel ``flipped_weight(ws)`` gives (see
    :func:`flip`). Otherwise the weight gradient runs first, in a workspace
    scope of its own (columns, padded input, GEMM result), retired before
    ``weight_matrix(ws)`` and the input gradient's workspaces are taken (the
    two never need memory at once), and the input gradient takes the per-tap
    method.
    """
    xp = ws.xp
    n = x.shape[0]
    out_hw = (grad.shape[1], grad.shape[2])
    o = grad.shape[3]
    og = o // groups
    sweep = transposed(geo) if gx is not None and takes_gradient_columns(geo) else None
    if sweep is not None:
        _from_gradient_columns(ws, x, grad, weight_gradient, gx, sweep, groups, grad_chunk, flipped_weight)
        return
    if weight_gradient is not None:
        gw = weight_gradient()
        with Workspace(ws.op, f"{ws.phase}.weight") as wws:
            for k, n0 in enumerate(range(0, n, chunk)):
                gs = grad[n0:n0 + chunk].reshape(-1, o)
                cols = kept if kept is not None else columns(wws, x[n0:n0 + chunk], geo, out_hw, groups)
                for g in range(groups):
                    target = gw[g * og:(g + 1) * og]
                    part = wws("conv.gw_part", (og, target[0].size), target.dtype)
                    blas_threads.matmul(xp, gs[:, g * og:(g + 1) * og].T, cols[:, g], out=part)
                    if k == 0:
                        xp.copyto(target, part.reshape(target.shape))
                    else:
                        target += part.reshape(target.shape)
    if gx is not None:
        wmat = weight_matrix(ws)
        for n0 in range(0, n, chunk):
            input_grad(ws, grad[n0:n0 + chunk].reshape(-1, o), wmat, gx[n0:n0 + chunk], geo, groups, out_hw)


def _from_gradient_columns(ws: Workspace, x: Any, grad: Any, weight_gradient: Callable[[], Any] | None, gx: Any,
                           sweep: Geometry, groups: int, step: int, flipped_weight: Callable[[Workspace], Any]) -> None:
    """Both gradients of a stride-1 sweep from one set of columns, those of the output gradient.

    With ``cols`` the columns of the gradient under ``sweep`` (see :func:`transposed`; rows: input
    pixels; columns: taps (i', j') of the flipped kernel, then output channels),
    ``gx = cols · flipped`` and ``cols^T · x`` is the weight gradient with its
    taps flipped: one im2col per chunk instead of one of the gradient and
    one of the input. Each chunk's weight gradient is written over the flipped
    kernel once its input gradient is done, flipped back and copied (first
    chunk) or added into ``gw`` (O, kh, kw, C/G); the next chunk flips the
    kernel again. So the two gradients need no more weight-sized memory than
    the input gradient alone (ResNet-18's last stage: 9 MiB less at the step's peak).
    Without a weight gradient the kernel is flipped once. The array the
    weight gradient goes to is asked for after the first chunk; when that
    chunk is the only one (ResNet-18's last stage), its columns are retired
    first, so a workspace for the array can share their memory.
    """
    xp = ws.xp
    n, c = x.shape[0], x.shape[3]
    cg = c // groups
    kh, kw = sweep.kernel
    flipped = gw = None
    with Workspace(ws.op, f"{ws.phase}.chunk") as chunk_ws:  # one scope for every chunk: one buffer per role
        for n0 in range(0, n, step):
            if flipped is None or weight_gradient is not None:  # the previous chunk's weight gradient overwrote it
                flipped = flipped_weight(ws)
            cols = columns(chunk_ws, grad[n0:n0 + step], sweep, gx.shape[1:3], groups)
            gx2 = gx[n0:n0 + step].reshape(-1, c)
            x2 = x[n0:n0 + step].reshape(-1, c)
            for g in range(groups):
                blas_threads.matmul(xp, cols[:, g], flipped[g], out=gx2[:, g * cg:(g + 1) * cg])
                if weight_gradient is not None:  # this group's kernel is done: its weight gradient goes over it
                    blas_threads.matmul(xp, cols[:, g].T, x2[:, g * cg:(g + 1) * cg], out=flipped[g])
            if weight_gradient is None:
                continue
            if gw is None:
                if n0 + step >= n:
                    chunk_ws.retire()
                gw = weight_gradient()
            _add_flipped_taps(xp, flipped, gw, groups, (kh, kw), first=n0 == 0)


def _add_flipped_taps(xp: Any, flipped: Any, gw: Any, groups: int, kernel: tuple[int, int], first: bool) -> None:
    """Copy (``first``) or add the weight gradient held over the flipped kernel into ``gw`` (O, kh, kw, C/G)."""
    kh, kw = kernel
    og, cg = gw.shape[0] // groups, flipped.shape[2]
    for g in range(groups):
        taps = flipped[g].reshape(kh, kw, og, cg)[::-1, ::-1].transpose(2, 0, 1, 3)  # the forward kernel's taps
        if first:
            xp.copyto(gw[g * og:(g + 1) * og], taps)
        else:
            gw[g * og:(g + 1) * og] += taps


def takes_gradient_columns(geo: Geometry) -> bool:
    """Whether a sweep's backward takes both gradients from the output gradient's columns (when the input
    gradient is wanted): stride 1, a kernel larger than 1×1, padding within :func:`transposed`'s bound."""
    return transposed(geo) is not None and not geo.pointwise


def transposed(geo: Geometry) -> Geometry | None:
    """The sweep over the output gradient whose convolution with the flipped kernel is the input gradient:
    stride 1, padding d·(k−1)−p, same kernel and dilation; None where the forward sweep is strided or pads
    more than d·(k−1) (its gradient then takes the per-tap method)."""
    if geo.stride != (1, 1):
        return None
    pad = tuple(d * (k - 1) - p for k, p, d in zip(geo.kernel, geo.padding, geo.dilation))
    if min(pad) < 0:
        return None
    return Geometry(geo.kernel, (1, 1), (pad[0], pad[1]), geo.dilation)


def flip(ws: Workspace, weight: Any, groups: int) -> Any:
    """(G, kh·kw·O/G, C/G): per group, the kernel ``weight`` (O, C/G, kh, kw) flipped in both spatial axes,
    rows in the (i, j, o) order of the gradient's columns."""
    weight = weight.transpose(0, 2, 3, 1)
    o, kh, kw, cg = weight.shape
    og = o // groups
    flipped = ws("conv.wflip", (groups, kh, kw, og, cg), weight.dtype)
    source = weight.reshape(groups, og, kh, kw, cg)[:, :, ::-1, ::-1, :].transpose(0, 2, 3, 1, 4)
    # In slabs of output channels whose reads stay in cache: the taps, outermost in the copy, are innermost in
    # the weight (ResNet-18's 512-channel kernel: 1.3 ms instead of 3.2 in one copy).
    slab = max(1, FLIP_SLAB_BYTES // (kh * kw * cg * weight.dtype.itemsize))
    for o in range(0, og, slab):
        ws.xp.copyto(flipped[:, :, :, o:o + slab], source[:, :, :, o:o + slab])
    return flipped.reshape(groups, kh * kw * og, cg)


def input_grad(ws: Workspace, gs: Any, wmat: Any, gx: Any, geo: Geometry, groups: int, out_hw: tuple[int, int]) -> None:
    """gx (n, H, W, C) = the transposed convolution of ``gs`` (rows, O), one GEMM and one strided add per tap.

    A tap that maps the output grid onto the whole input (the centre tap of a
    stride-1 "same" convolution, the only tap of a pointwise one) writes its
    GEMM straight into ``gx``; the others add into it.
    """
    xp = ws.xp
    n, h, w, c = gx.shape
    o = gs.shape[1]
    og, cg = o // groups, c // groups
    g2 = gx.reshape(-1, c)
    covering = [(i, j) for i, j in geo.taps() if _covers(geo.clipped(i, j, (h, w), out_hw), (h, w), out_hw)]
    first = covering[0] if covering else None
    if first is None:
        gx[...] = 0
    else:
        _tap_product(xp, gs, wmat, first, groups, og, cg, g2)
    if geo.pointwise:
        return
    t = ws("conv.tap", (gs.shape[0], c), gx.dtype)
    t4 = t.reshape(n, out_hw[0], out_hw[1], c)
    for i, j in geo.taps():
        clip = geo.clipped(i, j, (h, w), out_hw)
        if clip is None or (i, j) == first:
            continue
        ro, co, ri, ci = clip
        _tap_product(xp, gs, wmat, (i, j), groups, og, cg, t)
        gx[:, ri, ci, :] += t4[:, ro, co, :]


def _covers(clip: tuple[slice, slice, slice, slice] | None, hw: tuple[int, int], out_hw: tuple[int, int]) -> bool:
    """Whether a tap's clipped slices pair every output position with every input position, in order."""
    if clip is None or out_hw != hw:
        return False
    return all((s.start, s.stop, s.step or 1) == (0, size, 1) for s, size in zip(clip, (*out_hw, *hw)))


def _tap_product(xp: Any, gs: Any, wmat: Any, tap: tuple[int, int], groups: int, og: int, cg: int, out: Any) -> None:
    """out (rows, C) = gs (rows, O) times the weight of one tap, group by group."""
    i, j = tap
    for g in range(groups):
        blas_threads.matmul(xp, gs[:, g * og:(g + 1) * og], wmat[g * og:(g + 1) * og, i, j, :], out=out[:, g * cg:(g + 1) * cg])
