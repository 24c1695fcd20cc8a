"""What a layout plan puts in a Sequential's run: ops run in the layouts it chose, and conversions between layers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from neuroflow.composites import Sequential
from neuroflow.operator import MemoryDeclaration, Operator

#: How an op runs in the layouts the plan chose: a factory of the context each of its calls runs under.
Placement = Callable[[], AbstractContextManager[Any]]


class LayoutPlanned(Operator):
    """``op`` run under ``placement`` (the layouts the plan chose for it and its children), in place of ``op``."""

    def __init__(self, op: Operator, placement: Placement, layouts: tuple[str | None, str | None]) -> None:
        super().__init__()
        self.op = op  # a child: a tracing pool ends the op's buffers when this one is done
        self.layouts = layouts
        self.placement = placement

    @property
    def backward_reads_input(self) -> bool:  # type: ignore[override]
        return self.op.backward_reads_input

    @property
    def backward_reads_output(self) -> bool:  # type: ignore[override]
        return self.op.backward_reads_output

    @property
    def needs_input_grad(self) -> bool:  # type: ignore[override]
        return self.op.needs_input_grad

    def forward(self, x: Any) -> Any:
        with self.placement():
            return self.op.forward(x)

    def backward(self, grad_out: Any) -> Any:
        with self.placement():
            return self.op.backward(grad_out)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        with self.placement():
            return self.op.memory_declaration(input_shape)

    def writes_output_again(self) -> bool:
        return self.op.writes_output_again()

    def write_output_again(self) -> Any:
        with self.placement():
            return self.op.write_output_again()

    def input_keeper(self) -> Operator | None:
        return self.op.input_keeper()

    # the op's side of inference folding (neuroflow.folding), in the layouts the plan chose
    @property
    def folds_affine(self) -> bool:
        return bool(getattr(self.op, "folds_affine", False))

    @property
    def affine_in_eval(self) -> bool:
        return bool(getattr(self.op, "affine_in_eval", False))

    def forward_affine(self, x: Any, scale: Any, shift: Any, activation: str | None) -> Any:
        with self.placement():
            return self.op.forward_affine(x, scale, shift, activation)  # type: ignore[attr-defined]

    def inference_affine(self, dtype: Any) -> Any:
        with self.placement():
            return self.op.inference_affine(dtype)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"LayoutPlanned({self.op!r}, {self.layouts[0]}→{self.layouts[1]})"


class Conversion(Operator):
    """A layout conversion the plan put between two layers of ``host``: it runs on ``host``'s pool and backend."""

    host: Operator

    def __init__(self, convert: Operator, host: Operator) -> None:
        super().__init__()
        self.convert = convert  # a child, for the tracing pool (as LayoutPlanned's op)
        object.__setattr__(self, "host", host)  # not a child: the model owns it
        self.backward_reads_input = convert.backward_reads_input
        self.backward_reads_output = convert.backward_reads_output

    def _follow_host(self) -> None:
        convert, host = self.convert, self.host
        if convert.buffer_pool is not host.buffer_pool:
            convert.attach_pool(host.buffer_pool)
        if host.placed_on is not None and convert.placed_on is not host.placed_on:
            convert.to(host.placed_on)

    def forward(self, x: Any) -> Any:
        self._follow_host()
        return self.convert.forward(x)

    def backward(self, grad_out: Any) -> Any:
        self._follow_host()
        try:
            return self.convert.backward(grad_out)
        finally:  # no pool between steps: a traced step's would keep that step's arrays alive
            self.convert.attach_pool(None)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return self.convert.memory_declaration(input_shape)

    def __repr__(self) -> str:
        return f"Conversion({self.convert!r})"


@contextlib.contextmanager
def together(placements: list[Placement]) -> Iterator[None]:
    """Every placement's context at once (an op and the children it runs)."""
    with contextlib.ExitStack() as stack:
        for placement in placements:
            stack.enter_context(placement())
        yield


@contextlib.contextmanager
def running(sequential: Sequential, run: list[Operator], default: list[Operator]) -> Iterator[None]:
    """``sequential`` runs ``run`` for one call of its parent, and its default plan again after."""
    sequential.run_as(run)
    try:
        yield
    finally:
        sequential.run_as(default)


def strip(run: list[Operator]) -> list[Operator]:
    """A run without what an earlier plan added: its conversions, and the ops inside its wrappers."""
    return [layer.op if isinstance(layer, LayoutPlanned) else layer for layer in run if not isinstance(layer, Conversion)]
