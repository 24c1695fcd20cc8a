"""OpenCL C source of the GEMM kernels: C[b] = A[b] @ B[b] over strided views, one kernel per layout.

Every kernel takes the same arguments — (A, B, C, P) with P a device buffer of the longs (a_off, b_off,
c_off, a_sm, a_sk, b_sk, b_sn, c_sm, c_sn, a_sb, b_sb, c_sb, M, N, K), strides in elements — so the
launcher does not care which it runs (``Device.constants`` explains why the longs are not arguments).
A stride that is 1 is compiled in as a constant, which lets the compiler use contiguous vector loads.
``rows`` is also made per layout (``fixed``): every stride and size compiled in, and only the offsets
passed, as scalar arguments (A, B, C[, D], a_off, b_off, c_off[, d_off]). Measured on pocl with the MLP's
shapes, the same kernel ran 1.6× slower when it read the offsets from a buffer than from arguments, and a
scalar argument costs ~1 µs per launch once the kernel declares its type (``set_scalar_arg_dtypes``).

- ``rows``: B's rows are contiguous (``b_sn == 1``). A work item keeps ``rows`` × ``vectors``·``width`` of C
  in vector registers and per k adds a broadcast of A[i, k] times vector loads of B[k, n:n+width·vectors];
  deep products walk k in slices with a work-group barrier between them (pocl then runs the group's
  work items slice by slice, so each slice of A and B is read from cache by all of them).
  The last column block is shifted left to end at N and the last row block up to end at M (they recompute
  a few columns and rows another work item also writes, with the same values), so loads need no guard
  and A's rows are one pointer plus constant multiples of a_sm (no per-row clamped pointers: measured
  ~1.5× on the convolution GEMMs). Needs N ≥ width and M ≥ rows.
- ``dots``: A's and B's columns are contiguous (``a_sk == b_sk == 1``, as in x @ W.T). A work item
  computes ``rows`` × ``cols`` dot products with vector loads along k, summing the lanes once at the end.
- ``scalar``: any strides, a 4×4 block of scalars per work item; loads clamped into the matrix.
- ``tiled``: for GPUs. A work group stages ``TILE_K``-deep slices of A and B in local memory and each
  work item accumulates a ``per``×``per`` block from them. pocl runs it too (that is how it is tested),
  but on a CPU local memory is only an extra copy.

Measured on pocl (2-core AVX-512 Xeon): plain ``a * b + c`` compiles to FMA; ``fma()`` calls were slower.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from neuroflow_opencl.cdtypes import c_type, preamble, vector_convert, vector_load, vector_store, vector_types

STRIDES = ("a_sm", "a_sk", "b_sk", "b_sn", "c_sm", "c_sn")
TILE_K = 16
#: What a ``fixed`` kernel compiles in, in this order (a bias adds its stride ``d_s``).
FIXED = (*STRIDES, "a_sb", "b_sb", "c_sb", "M", "N", "K")


def _header(t: str, ta: str, tb: str, unit: tuple[bool, ...], attributes: str = "", bias: bool = False,
            fixed: tuple[int, ...] | None = None, sums: bool = False) -> str:
    """The kernel's signature and its sizes, strides and offsets as locals: read from P, or with ``fixed`` (the
    values of ``FIXED``, then the strides of a bias D and of row sums E) compiled in, the offsets then being
    scalar arguments."""
    buffers = [f"__global const {ta}* restrict A", f"__global const {tb}* restrict B", f"__global {t}* restrict C",
               *([f"__global const {t}* restrict D"] if bias else []), *([f"__global {t}* restrict E"] if sums else [])]
    if fixed is not None:
        offsets = ["a_off", "b_off", "c_off", *(["d_off"] if bias else []), *(["e_off"] if sums else [])]
        names = (*FIXED, *(["d_s"] if bias else []), *(["e_s"] if sums else []))
        values = "\n".join(f"    const long {n} = {v};" for n, v in zip(names, fixed, strict=True))
        return f"""{attributes}__kernel void gemm({', '.join([*buffers, *(f"long {n}" for n in offsets)])})
{{
{values}
    const long batch = get_global_id(2);
    a_off += batch * a_sb; b_off += batch * b_sb; c_off += batch * c_sb;
"""
    params = [*buffers, "__global const long* restrict P"]
    names = ("a_off", "b_off", "c_off", *(f"{n}_arg" for n in STRIDES), "a_sb", "b_sb", "c_sb", "M", "N", "K")
    loads = "\n".join(f"    {'long' if n.endswith('_off') else 'const long'} {n} = P[{i}];" for i, n in enumerate(names))
    consts = "\n".join(f"    const long {n} = {'1' if u else n + '_arg'};" for n, u in zip(STRIDES, unit, strict=True))
    return f"""{attributes}__kernel void gemm({', '.join(params)})
{{
{loads}
{consts}
    const long batch = get_global_id(2);
    a_off += batch * a_sb; b_off += batch * b_sb; c_off += batch * c_sb;
"""


@cache
def rows_source(out_dtype: Any, a_dtype: Any, b_dtype: Any, rows: int, width: int,
                vectors: int = 1, k_block: int = 0, bias: str = "", *, fixed: tuple[int, ...], sums: bool = False) -> str:
    """``rows`` × ``vectors``·``width`` of C per work item; ``k_block`` > 0 adds a work-group barrier every
    ``k_block`` steps of k, so that pocl, which runs a group's work items one after another between
    barriers, walks every item over one k-slice of A and B while that slice is still in cache.

    ``bias`` adds a vector D to the product before the store, as a separate add would: ``row`` one value per
    column of C, ``column`` one per row. ``fixed`` gives the values of ``FIXED``, then the bias stride, to
    compile in (the kernel is made per layout; see the module docstring). ``sums`` also writes the sums of
    A's rows over k into a vector E (its stride last in ``fixed``): Linear's bias gradient beside its weight
    gradient, from the values of A the product loads anyway."""
    t, ta, tb = c_type(out_dtype), c_type(a_dtype), c_type(b_dtype)
    v = f"{t}{width}"
    span = width * vectors
    lines = [
        f"    const long n0 = min((long)get_global_id(0) * {span}, N - {span});",
        # Like the columns, the last row block is shifted up to end at M: every block is whole, so the rows
        # of A are one pointer plus constant multiples of a_sm. Surplus work items (the global size is
        # rounded up) return, unless the k-slice barriers need them to compute a copy of the last block.
        f"    if ((long)get_global_id(1) * {rows} >= M) return;" if not k_block else "",
        f"    const long m0 = min((long)get_global_id(1) * {rows}, M - {rows});",
        f"    __global const {tb}* b = B + b_off + n0;",
        f"    __global const {ta}* a = A + a_off + m0 * a_sm;",
    ]
    acc = [(i, q) for i in range(rows) for q in range(vectors)]
    lines += [f"    {v} c{i}_{q} = 0;" for i, q in acc]
    lines += [f"    {t} s{i} = 0;" for i in range(rows) if sums]
    body = [f"        const {v} y{q} = {vector_convert(tb, t, width, vector_load(tb, width, f'b + p * b_sk + {q * width}'))};"
            for q in range(vectors)]
    body += [f"        const {t} x{i} = ({t})a[{i} * a_sm + p * a_sk];" for i in range(rows)]
    body += [f"        s{i} += x{i};" for i in range(rows) if sums]
    body += [f"        c{i}_{q} = x{i} * y{q} + c{i}_{q};" for i, q in acc]
    if k_block:
        lines.append(f"    for (long p0 = 0; p0 < K; p0 += {k_block}) {{")
        lines.append(f"        const long p1 = min(p0 + {k_block}, K);")
        lines.append("        for (long p = p0; p < p1; ++p) {")
        lines += ["    " + line for line in body]
        lines.append("        }")
        lines.append("        barrier(CLK_LOCAL_MEM_FENCE);")
        lines.append("    }")
    else:
        lines.append("    for (long p = 0; p < K; ++p) {")
        lines += body
        lines.append("    }")
    if sums:  # the first column of work items writes them (a shifted last row block writes equal values twice)
        lines.append("    if (get_global_id(0) == 0) {")
        lines += [f"        E[e_off + (m0 + {i}) * e_s] = s{i};" for i in range(rows)]
        lines.append("    }")
    lines.append(f"    __global {t}* c = C + c_off + n0 * c_sn;")
    for i in range(rows):
        if bias == "column":
            lines.append(f"    {{ const {t} d = D[d_off + (m0 + {i}) * d_s];")
            lines += [f"      c{i}_{q} += d;" for q in range(vectors)]
            lines.append("    }")
        elif bias == "row":
            lines += [f"    c{i}_{q} += {_bias_row(t, width, q)};" for q in range(vectors)]
        lines.append("    {")
        for q in range(vectors):
            store = vector_store(t, width, f"c{i}_{q}", f"c + (m0 + {i}) * c_sm + {q * width}")
            lines.append(f"        if (c_sn == 1) {store}")
            lines.append("        else {")
            lines += [f"            c[(m0 + {i}) * c_sm + {q * width + j} * c_sn] = c{i}_{q}.s{j:x};" for j in range(width)]
            lines.append("        }")
        lines.append("    }")
    header = _header(t, ta, tb, (), bias=bool(bias), fixed=fixed, sums=sums)
    return (preamble(out_dtype, a_dtype, b_dtype) + vector_types(t, tb, widths=(width,)) + header
            + "\n".join(line for line in lines if line) + "\n}\n")


def _bias_row(t: str, width: int, q: int) -> str:
    """The bias values of accumulator column block ``q``: a vector load when D is dense, else gathered."""
    lanes = ", ".join(f"D[d_off + (n0 + {q * width + j}) * d_s]" for j in range(width))
    return f"(d_s == 1 ? {vector_load(t, width, f'D + d_off + n0 + {q * width}')} : ({t}{width})({lanes}))"


@cache
def dots_source(out_dtype: Any, a_dtype: Any, b_dtype: Any, unit: tuple[bool, ...],
                rows: int, cols: int, width: int) -> str:
    t, ta, tb = c_type(out_dtype), c_type(a_dtype), c_type(b_dtype)
    v = f"{t}{width}"
    lines = [
        f"    const long n0 = get_global_id(0) * {cols};",
        f"    const long m0 = get_global_id(1) * {rows};",
        "    if (m0 >= M || n0 >= N) return;",
    ]
    lines += [f"    __global const {ta}* a{i} = A + a_off + min(m0 + {i}, M - 1) * a_sm;" for i in range(rows)]
    lines += [f"    __global const {tb}* b{j} = B + b_off + min(n0 + {j}, N - 1) * b_sn;" for j in range(cols)]
    lines += [f"    {v} c{i}{j} = 0;" for i in range(rows) for j in range(cols)]
    lines.append(f"    const long kv = K - K % {width};")
    lines.append(f"    for (long p = 0; p < kv; p += {width}) {{")
    lines += [f"        const {v} x{i} = {vector_convert(ta, t, width, vector_load(ta, width, f'a{i} + p'))};" for i in range(rows)]
    lines += [f"        const {v} y{j} = {vector_convert(tb, t, width, vector_load(tb, width, f'b{j} + p'))};" for j in range(cols)]
    lines += [f"        c{i}{j} = x{i} * y{j} + c{i}{j};" for i in range(rows) for j in range(cols)]
    lines.append("    }")
    lanes = " + ".join(f"c{{i}}{{j}}.s{q:x}" for q in range(width))
    lines += [f"    {t} s{i}{j} = {lanes.format(i=i, j=j)};" for i in range(rows) for j in range(cols)]
    lines.append("    for (long p = kv; p < K; ++p) {")
    lines += [f"        s{i}{j} += ({t})a{i}[p] * b{j}[p];" for i in range(rows) for j in range(cols)]
    lines.append("    }")
    lines += [f"    if (m0 + {i} < M && n0 + {j} < N) C[c_off + (m0 + {i}) * c_sm + (n0 + {j}) * c_sn] = s{i}{j};"
              for i in range(rows) for j in range(cols)]
    return (preamble(out_dtype, a_dtype, b_dtype) + vector_types(ta, tb, widths=(width,)) + _header(t, ta, tb, unit)
            + "\n".join(lines) + "\n}\n")


@cache
def scalar_source(out_dtype: Any, a_dtype: Any, b_dtype: Any, unit: tuple[bool, ...], rows: int, cols: int) -> str:
    t, ta, tb = c_type(out_dtype), c_type(a_dtype), c_type(b_dtype)
    lines = [
        f"    const long n0 = get_global_id(0) * {cols};",
        f"    const long m0 = get_global_id(1) * {rows};",
        "    if (m0 >= M || n0 >= N) return;",
    ]
    lines += [f"    __global const {ta}* a{i} = A + a_off + min(m0 + {i}, M - 1) * a_sm;" for i in range(rows)]
    lines += [f"    __global const {tb}* b{j} = B + b_off + min(n0 + {j}, N - 1) * b_sn;" for j in range(cols)]
    lines += [f"    {t} c{i}{j} = 0;" for i in range(rows) for j in range(cols)]
    lines.append("    for (long p = 0; p < K; ++p) {")
    lines += [f"        const {t} x{i} = a{i}[p * a_sk];" for i in range(rows)]
    lines += [f"        const {t} y{j} = b{j}[p * b_sk];" for j in range(cols)]
    lines += [f"        c{i}{j} = x{i} * y{j} + c{i}{j};" for i in range(rows) for j in range(cols)]
    lines.append("    }")
    lines += [f"    if (m0 + {i} < M && n0 + {j} < N) C[c_off + (m0 + {i}) * c_sm + (n0 + {j}) * c_sn] = c{i}{j};"
              for i in range(rows) for j in range(cols)]
    return preamble(out_dtype, a_dtype, b_dtype) + _header(t, ta, tb, unit) + "\n".join(lines) + "\n}\n"


@cache
def tiled_source(out_dtype: Any, a_dtype: Any, b_dtype: Any, unit: tuple[bool, ...], group: int, per: int) -> str:
    """A ``group``×``group`` work group computes a (group·per)² tile of C; work item (tx, ty) owns the
    rows ty + i·group and columns tx + j·group, so neighbouring work items touch neighbouring addresses."""
    t, ta, tb = c_type(out_dtype), c_type(a_dtype), c_type(b_dtype)
    tile = group * per
    lines = [
        f"    __local {t} As[{TILE_K}][{tile} + 1];",
        f"    __local {t} Bs[{TILE_K}][{tile} + 1];",
        "    const int tx = get_local_id(0), ty = get_local_id(1);",
        f"    const long n0 = get_group_id(0) * {tile}, m0 = get_group_id(1) * {tile};",
        f"    const int lid = ty * {group} + tx;",
        *(f"    {t} c{i}{j} = 0;" for i in range(per) for j in range(per)),
        f"    for (long k0 = 0; k0 < K; k0 += {TILE_K}) {{",
        # Each work item stages tile·TILE_K / group² elements of each operand, zero outside the matrices.
        f"        for (int e = lid; e < {tile * TILE_K}; e += {group * group}) {{",
        f"            const int r = e / {TILE_K}, q = e % {TILE_K};",
        "            const long m = m0 + r, k = k0 + q;",
        f"            As[q][r] = (m < M && k < K) ? ({t})A[a_off + m * a_sm + k * a_sk] : ({t})0;",
        "        }",
        f"        for (int e = lid; e < {tile * TILE_K}; e += {group * group}) {{",
        f"            const int q = e / {tile}, s = e % {tile};",
        "            const long n = n0 + s, k = k0 + q;",
        f"            Bs[q][s] = (n < N && k < K) ? ({t})B[b_off + k * b_sk + n * b_sn] : ({t})0;",
        "        }",
        "        barrier(CLK_LOCAL_MEM_FENCE);",
        f"        for (int q = 0; q < {TILE_K}; ++q) {{",
        *(f"            const {t} x{i} = As[q][ty + {i * group}];" for i in range(per)),
        *(f"            const {t} y{j} = Bs[q][tx + {j * group}];" for j in range(per)),
        *(f"            c{i}{j} = x{i} * y{j} + c{i}{j};" for i in range(per) for j in range(per)),
        "        }",
        "        barrier(CLK_LOCAL_MEM_FENCE);",
        "    }",
    ]
    for i in range(per):
        for j in range(per):
            m, n = f"(m0 + ty + {i * group})", f"(n0 + tx + {j * group})"
            lines.append(f"    if ({m} < M && {n} < N) C[c_off + {m} * c_sm + {n} * c_sn] = c{i}{j};")
    attributes = f"__attribute__((reqd_work_group_size({group}, {group}, 1)))\n"
    return preamble(out_dtype, a_dtype, b_dtype) + _header(t, ta, tb, unit, attributes) + "\n".join(lines) + "\n}\n"
