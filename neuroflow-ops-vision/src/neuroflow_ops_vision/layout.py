"""Feature-map layouts (NCHW, NHWC), input checks for 4-d ops, ConvertLayout, and the layout pass's protocol.

Users hand ops NCHW arrays, as in PyTorch, or NHWC through ``layout="NHWC"``.
Convolution computes in NHWC (channels contiguous: im2col is a strided copy
and one GEMM). Under a Trainer, :mod:`neuroflow.layout_pass` runs a chain of
these ops in NHWC between one conversion at its entry and one at its exit;
the ops tell it how through :func:`layout_options` and :class:`LayoutSwitch`.
A layout the user gives as NHWC is a hint the pass leaves alone; NCHW,
PyTorch's and the default, leaves the internal layout to the runtime.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from neuroflow.errors import ShapeError
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow_ops_vision.workspace import Workspace

LAYOUTS = ("NCHW", "NHWC")

# Axis permutations between the layouts.
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def check_layout(layout: str, owner: str) -> str:
    """``layout`` upper-cased, or a ValueError naming ``owner`` and the layouts that exist."""
    name = str(layout).upper()
    if name not in LAYOUTS:
        raise ValueError(f"{owner}: unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    return name


def channel_axis(layout: str) -> int:
    return 1 if layout == "NCHW" else 3


def spatial_axes(layout: str) -> tuple[int, int]:
    return (2, 3) if layout == "NCHW" else (1, 2)


def nhwc_shape(shape: tuple[int, ...], layout: str) -> tuple[int, int, int, int]:
    """(N, H, W, C) of a 4-d shape given in ``layout``."""
    n, a, b, c = shape
    return (n, b, c, a) if layout == "NCHW" else (n, a, b, c)


def from_nhwc_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """A shape given as (N, H, W, C), written in ``layout``."""
    n, h, w, c = shape
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def expected_text(channels: int | None, layout: str) -> str:
    c = "C" if channels is None else str(channels)
    return f"(N, {c}, H, W)" if layout == "NCHW" else f"(N, H, W, {c})"


def check_feature_map(op: Operator, x: Any, channels: int | None, layout: str) -> None:
    """Raise ShapeError naming ``op`` unless ``x`` is a 4-d floating map with ``channels`` channels."""
    op.check_input(x, min_ndim=1)
    if x.ndim != 4 or (channels is not None and x.shape[channel_axis(layout)] != channels):
        other = "NHWC" if layout == "NCHW" else "NCHW"
        hint = ""
        if x.ndim == 4 and channels is not None and x.shape[channel_axis(other)] == channels:
            hint = f" (this looks like {other}; pass layout={other!r})"
        raise ShapeError(
            f"{op!r} got input of shape {tuple(x.shape)}; expected {expected_text(channels, layout)}{hint}"
        )


def check_declared_shape(op: Operator, shape: tuple[int, ...], channels: int | None, layout: str) -> None:
    """The shape-only half of :func:`check_feature_map`, for ``memory_declaration``."""
    if len(shape) != 4 or (channels is not None and shape[channel_axis(layout)] != channels):
        raise ShapeError(f"{op!r} got input of shape {tuple(shape)}; expected {expected_text(channels, layout)}")


def check_grad(op: Operator, grad: Any, expected: tuple[int, ...]) -> None:
    """Raise ShapeError unless the gradient handed to ``op.backward`` has the forward output's shape."""
    if tuple(getattr(grad, "shape", ())) != tuple(expected):
        raise ShapeError(
            f"{op!r}.backward got gradient of shape {tuple(getattr(grad, 'shape', ()))}; expected {tuple(expected)}"
        )


def permute_into(xp: Any, src: Any, axes: tuple[int, ...], out: Any) -> Any:
    """Write ``src.transpose(axes)`` into the contiguous array ``out`` (one copy pass)."""
    xp.copyto(out, src.transpose(axes))
    return out


class ConvertLayout(Operator):
    """Permutes a feature map between NCHW and NHWC; backward permutes the gradient back.

    The layout pass puts one of these where a chain of NHWC layers starts or
    ends and no layer there converts by itself. With one channel the two
    layouts share memory and the conversion is a free reshape.
    """

    backward_reads_input = False  # a permutation: backward needs the shape alone
    backward_reads_output = False

    def __init__(self, source: str = "NCHW", target: str = "NHWC") -> None:
        super().__init__()
        self.source = check_layout(source, "ConvertLayout")
        self.target = check_layout(target, "ConvertLayout")
        self._in_shape: tuple[int, ...] | None = None

    def _axes(self, backward: bool = False) -> tuple[int, ...]:
        if self.source == self.target:
            return (0, 1, 2, 3)
        to_target = TO_NHWC if self.target == "NHWC" else TO_NCHW
        if backward:
            return TO_NCHW if to_target == TO_NHWC else TO_NHWC
        return to_target

    def _out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[a] for a in self._axes())

    def forward(self, x: Any) -> Any:
        self.check_input(x, min_ndim=1)
        if x.ndim != 4:
            raise ShapeError(f"{self!r} got input of shape {tuple(x.shape)}; expected {expected_text(None, self.source)}")
        self._in_shape = tuple(x.shape)
        out_shape = self._out_shape(self._in_shape)
        if self.source == self.target:
            return x
        if x.shape[channel_axis(self.source)] == 1:
            return x.reshape(out_shape)
        y = self.buffer("y", out_shape, x.dtype)
        return permute_into(self.xp, x, self._axes(), y)

    def backward(self, grad_out: Any) -> Any:
        if self._in_shape is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        if grad_out is None:  # the layer after us was told its input needs no gradient
            return None
        check_grad(self, grad_out, self._out_shape(self._in_shape))
        if self.source == self.target:
            return grad_out
        if self._in_shape[channel_axis(self.source)] == 1:
            return grad_out.reshape(self._in_shape)
        gx = self.buffer("gx", self._in_shape, grad_out.dtype)
        return permute_into(self.xp, grad_out, self._axes(backward=True), gx)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        check_declared_shape(self, tuple(input_shape), None, self.source)
        return MemoryDeclaration(self._out_shape(tuple(input_shape)))

    def get_config(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target}

    def __repr__(self) -> str:
        return f"ConvertLayout({self.source}→{self.target})"


class ChannelsLastOperator(Operator):
    """Base of ops that compute in NHWC and permute at their edges when handed NCHW.

    ``layout`` is the layout of the input (and of its gradient), and
    ``output_layout`` that of the output (and of the gradient backward
    receives). The permutations cost one copy each way, which is why the model
    builders run their layers in NHWC: their first convolution reads NCHW
    and writes NHWC, and nothing converts after it.
    """

    layout: str = "NHWC"
    output_layout: str = "NHWC"

    def _to_nhwc(self, a: Any, layout: str, key: str, ws: Workspace | None = None) -> Any:
        """``a`` in NHWC: itself, a free reshape with one channel, or a permuted copy.

        The copy goes to the workspace ``ws`` when given (it is transient),
        otherwise to an op buffer (it is cached for backward).
        """
        if layout == "NHWC":
            return a
        shape = nhwc_shape(tuple(a.shape), "NCHW")
        if a.shape[1] == 1:
            return a.reshape(shape)
        out = self.buffer(key, shape, a.dtype) if ws is None else ws(f"layout.{key}", shape, a.dtype)
        return permute_into(self.xp, a, TO_NHWC, out)

    def _nhwc_result(self, layout: str, key: str, shape: tuple[int, ...], dtype: Any, ws: Workspace) -> Any:
        """Where an NHWC result goes: the op's own buffer, or a workspace when it is permuted afterwards."""
        if layout == "NHWC" or shape[3] == 1:  # one channel: _from_nhwc returns it reshaped
            return self.buffer(key, shape, dtype)
        return ws(f"layout.{key}", shape, dtype)

    def _from_nhwc(self, a: Any, layout: str, key: str) -> Any:
        """An NHWC result in ``layout`` (an op buffer named ``key`` when permuted)."""
        if layout == "NHWC":
            return a
        shape = from_nhwc_shape(tuple(a.shape), "NCHW")
        if a.shape[3] == 1:
            return a.reshape(shape)
        return permute_into(self.xp, a, TO_NCHW, self.buffer(key, shape, a.dtype))


#: The layout vision's ops compute fastest in, on every backend: a convolution computes in NHWC wherever it runs (an
#: NCHW one permutes its input and output), and pooling and BatchNorm read channels contiguously there.
PREFERRED_LAYOUT = "NHWC"
#: The (input, output) layouts of an op that computes in either, the same on both sides.
SAME_LAYOUT = tuple((layout, layout) for layout in LAYOUTS)
#: ... of an op that permutes each side for itself (a convolution).
ANY_LAYOUTS = tuple((source, target) for source in LAYOUTS for target in LAYOUTS)


def layout_options(written: tuple[str | None, str | None], pairs: tuple[tuple[str | None, str | None], ...],
                   permutes: bool = False, branches: tuple[Operator, ...] = ()) -> LayoutOptions:
    """What a vision op tells :mod:`neuroflow.layout_pass`: the ``pairs`` it may run with, or only ``written`` when
    a side was given as NHWC (the user's hint). An op that ``permutes`` an NCHW side into NHWC and back costs a
    conversion per such side; one that computes natively in both layouts, half of one."""
    hinted = "NHWC" in written
    return LayoutOptions(written=written, pairs=(written,) if hinted else pairs, preferred=PREFERRED_LAYOUT,
                         penalty=1.0 if permutes else 0.5, convert=ConvertLayout, layouts=LAYOUTS, branches=branches)


class LayoutSwitch:
    """``op`` with other values of its layout attributes for the length of a ``with`` block (one call).

    What an op's ``with_layout(input_layout, output_layout)`` returns: the layout pass runs each call of the
    op under it, and the op has the layouts it was written with again after.
    """

    def __init__(self, op: Operator, **values: Any) -> None:
        self.op, self.values = op, values
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        for name, value in self.values.items():
            self.saved[name] = getattr(self.op, name)
            object.__setattr__(self.op, name, value)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for name, value in self.saved.items():
            object.__setattr__(self.op, name, value)
