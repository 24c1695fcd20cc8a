"""Operator: the unit of computation, with an explicit forward and backward.

An operator caches in ``forward`` exactly what its ``backward`` needs and
says so through :meth:`Operator.memory_declaration`, which the memory planner
reads. Parameter gradients accumulate into the parameters' ``grad`` buffers.

What an op, a composite and a third-party op author use (the public API,
``docs/plugins/write-an-op-plugin.md``): :meth:`Operator.buffer` for outputs
and workspaces, :meth:`Operator.grad_target` / :meth:`Operator.accumulate_grad`
for parameter gradients, :meth:`Operator.save_input` / :attr:`Operator.saved_input`
for the input backward reads (which a composite may point at a recomputed
copy), :attr:`Operator.buffer_pool` for the buffer pool attached, and
:meth:`Operator.is_on` / :attr:`Operator.placed_on` for where it runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroflow.backends.selection import cpu_backend
from neuroflow.errors import ShapeError
from neuroflow.tensor import Tensor

if TYPE_CHECKING:
    from neuroflow.backends.base import Backend
    from neuroflow.buffers.pool import BufferPool
    from neuroflow.buffers.trace import TracingPool


_generations = itertools.count(1)
_generation = 0


def structure_generation() -> int:
    """A number that changes whenever any operator gains or rebinds a parameter, buffer or child, moves to a
    backend or changes dtype: a runtime that caches what it found by walking a model (its trainable
    parameters, its modules, a validated input) keeps the cache while this number stays the same."""
    return _generation


def _structure_changed() -> None:
    global _generation
    _generation = next(_generations)  # one atomic step: a reader sees an old number or a new one, never a torn one


def attach_pool_each(modules: list[Operator], pool: BufferPool | TracingPool | None) -> None:
    """What ``model.attach_pool(pool)`` does, from the list ``list(model.modules())`` made while the model was as it
    is now (:func:`structure_generation` unchanged) and none of them overrides ``attach_pool``: for a runtime
    that lends its pool to a model for every call (the Trainer's session), without walking the tree each time."""
    for module in modules:
        object.__setattr__(module, "_pool", pool)


def check_array(owner: object, x: Any, trailing: tuple[int, ...] | None, min_ndim: int, dtype: Any) -> None:
    """Raise ShapeError naming ``owner`` unless ``x`` is a floating array of at least ``min_ndim`` dimensions ending
    in ``trailing``, and of ``dtype`` (the owner's parameters') unless that is None: ``Operator.check_input``."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise ShapeError(f"{owner!r} got {type(x).__name__}; expected an array")
    if len(shape) < min_ndim or (trailing is not None and tuple(shape[len(shape) - len(trailing):]) != trailing):
        expected = "(*, " + ", ".join(map(str, trailing)) + ")" if trailing else f"{min_ndim}+ dimensions"
        raise ShapeError(f"{owner!r} got input of shape {tuple(shape)}; expected {expected}")
    if x.dtype.kind != "f":
        raise ShapeError(f"{owner!r} got input of dtype {x.dtype}; expected a floating dtype (float32)")
    if dtype is not None and x.dtype != dtype:
        raise ShapeError(f"{owner!r} got input of dtype {x.dtype}; its parameters are {dtype}")


class MemoryDeclaration:
    """What one call of an operator keeps alive and needs transiently, for a given input shape.

    ``cached`` lists the shapes kept from forward until backward, ``workspace``
    the shapes needed only during a call, ``output`` the output's shape.
    """

    __slots__ = ("output", "cached", "workspace")

    def __init__(
        self,
        output: tuple[int, ...],
        cached: list[tuple[int, ...]] | None = None,
        workspace: list[tuple[int, ...]] | None = None,
    ) -> None:
        self.output = tuple(output)
        self.cached = [tuple(s) for s in cached or []]
        self.workspace = [tuple(s) for s in workspace or []]


class Operator:
    """Base class of every op and composite.

    Subclasses implement :meth:`forward` and :meth:`backward`; a Tensor
    assigned as an attribute becomes a parameter, an Operator a child.
    """

    training: bool = True
    #: False (set by the runtime on a model's first layer): backward may return None and skip the input gradient.
    needs_input_grad: bool = True
    #: Whether backward reads the array forward was given (or a view of it). False lets the memory planner
    #: give the input's memory to later buffers once its producer is done with it too (see Sequential).
    backward_reads_input: bool = True
    #: Whether backward reads the array forward returned. False: the output dies with its consumers.
    backward_reads_output: bool = True
    #: Activations (by name, "relu") this op can apply to its output in the same pass through its
    #: ``activation`` attribute, taking over the activation layer after it, or, for ``..._before``,
    #: the one before it (the op commutes with it). See :mod:`neuroflow.fusion`.
    absorbs_activation_after: tuple[str, ...] = ()
    absorbs_activation_before: tuple[str, ...] = ()
    #: Set by ops that train with statistics of the whole batch (BatchNorm); a data-parallel run with
    #: ``sync_batchnorm`` then gives them ``cross_rank_sum``: the sum over all ranks of a float64 host vector.
    normalises_over_batch: bool = False
    cross_rank_sum: Callable[[np.ndarray], np.ndarray] | None = None
    _parameters: dict[str, Tensor]
    _buffers: dict[str, Tensor]
    _children: dict[str, Operator]
    _backend: Backend | None
    _pool: Any
    _saved_input: Any
    _checked_input: tuple[Any, ...] | None = None  # (shape, dtype, trailing, min_ndim, parameters' dtype) accepted

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_backend", None)
        object.__setattr__(self, "_pool", None)
        object.__setattr__(self, "_saved_input", None)

    # ----------------------------------------------------------------- attributes
    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Tensor):
            if name not in self._buffers:
                self._parameters[name] = value
            _structure_changed()
        elif isinstance(value, Operator):
            self._children[name] = value
            _structure_changed()
        elif callable(value) and callable(getattr(type(self), name, None)):
            _structure_changed()  # a method replaced on the instance (``layer.forward = f``): runs differ now
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, tensor: Tensor) -> None:
        """Keep ``tensor`` as state that is saved and moved but never trained (running statistics)."""
        self._buffers[name] = tensor
        self._parameters.pop(name, None)
        object.__setattr__(self, name, tensor)
        _structure_changed()

    # ----------------------------------------------------------------- computation
    def forward(self, x: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement forward")

    def backward(self, grad_out: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement backward")

    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    # ----------------------------------------------------------------- what backward reads
    def save_input(self, x: Any) -> None:
        """Keep ``x`` for backward: the input forward was given, or the view of it that backward reads. An op's
        forward calls this; a composite that let the array go after forward calls it before the op's backward
        with a copy written again, same values, same form (Sequential, ``BasicBlock.read_input_from``)."""
        object.__setattr__(self, "_saved_input", x)

    @property
    def saved_input(self) -> Any:
        """The array the last :meth:`save_input` kept; None before the first forward, or for an op that keeps
        its input otherwise. A composite reads it to size a recomputation or to hand it to another child."""
        return self._saved_input

    # ----------------------------------------------------------------- recomputation (see Sequential)
    def writes_output_again(self) -> bool:  # whether write_output_again can: a parent may let the output go
        return False

    def write_output_again(self) -> Any:
        """The last output written again, bit for bit, from what backward keeps anyway, into a buffer of this
        op's that its backward then reads instead."""
        raise NotImplementedError(f"{type(self).__name__} cannot write its output again")

    def input_keeper(self) -> Operator | None:  # the op (self or a chain's first) keeping the input as saved_input
        return None

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape ``forward`` returns for an input of ``input_shape``; raises ShapeError when invalid."""
        return self.memory_declaration(input_shape).output

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        """What a call caches for backward and needs as workspace. This default (for ops that do not declare)
        says: output of the input's shape, the input cached. Ops override it to tell the planner the truth."""
        return MemoryDeclaration(input_shape, cached=[input_shape])

    # ----------------------------------------------------------------- tree walking
    def named_children(self) -> Iterator[tuple[str, Operator]]:
        yield from self._children.items()

    def children(self) -> Iterator[Operator]:
        yield from self._children.values()

    def modules(self) -> Iterator[Operator]:
        """This operator and all its descendants, parents first."""
        yield self
        for child in self._children.values():
            yield from child.modules()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Parameters (trainable or frozen) under dotted names, in a stable order."""
        for name, tensor in self._parameters.items():
            yield prefix + name, tensor
        for child_name, child in self._children.items():
            yield from child.named_parameters(f"{prefix}{child_name}.")

    def parameters(self) -> list[Tensor]:
        return [t for _, t in self.named_parameters()]

    def trainable_parameters(self) -> list[Tensor]:
        return [t for t in self.parameters() if t.requires_grad]

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for name, tensor in self._buffers.items():
            yield prefix + name, tensor
        for child_name, child in self._children.items():
            yield from child.named_buffers(f"{prefix}{child_name}.")

    def state_dict(self) -> dict[str, Any]:
        """Parameters and buffers by dotted name, as arrays on the current backend."""
        state = {name: t.data for name, t in self.named_parameters()}
        state.update({name: t.data for name, t in self.named_buffers()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy arrays into this model's parameters and buffers by name, checking shapes."""
        own = dict(self.named_parameters())
        own.update(self.named_buffers())
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise KeyError(f"state_dict does not match the model: missing {missing}, unexpected {unexpected}")
        for name, tensor in own.items():
            value = state[name]
            if tuple(value.shape) != tensor.shape:
                raise ShapeError(f"{name}: model has shape {tensor.shape}, state_dict has {tuple(value.shape)}")
            tensor.data[...] = self.backend.from_host(np.asarray(value)) if isinstance(value, np.ndarray) else value

    # ----------------------------------------------------------------- modes and placement
    def train(self, mode: bool = True) -> Operator:
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Operator:
        return self.train(False)

    @property
    def backend(self) -> Backend:
        """The backend this operator runs on: where :meth:`to` placed it, or the cpu backend."""
        if self._backend is None:
            return cpu_backend()
        return self._backend

    @property
    def placed_on(self) -> Backend | None:
        """The backend :meth:`to` placed this operator on, or None when it never moved (it then computes with
        numpy on host arrays and asks no backend for fused kernels, though :attr:`backend` says cpu)."""
        return self._backend

    def is_on(self, backend: Backend) -> bool:
        """Whether this operator and every operator under it were placed on ``backend`` with :meth:`to` (a
        caller that needs the model there moves it when not)."""
        return self._backend is backend and all(child.is_on(backend) for child in self._children.values())

    @property
    def xp(self) -> Any:
        """The array namespace of this operator's backend (numpy on cpu)."""
        return np if self._backend is None else self._backend.xp

    def fused(self, name: str, like: Any) -> Any:
        """The backend's fused kernel ``name`` for arrays like ``like`` (``Backend.fused``), or None: run the generic code."""
        return None if self._backend is None else self._backend.fused(name, like)

    def to(self, backend: Backend) -> Operator:
        """Move parameters and buffers to ``backend`` and run there from now on (this operator, then each child)."""
        for tensor in self._own_tensors():
            host = self.backend.to_host(tensor.data)
            tensor.data = backend.from_host(host)
            if tensor.grad is not None:
                tensor.grad = backend.from_host(self.backend.to_host(tensor.grad))
        object.__setattr__(self, "_backend", backend)
        _structure_changed()
        self._moved_to(backend)
        for child in self._children.values():
            child.to(backend)
        return self

    def _own_tensors(self) -> list[Tensor]:
        """This operator's own parameters and buffers (not its children's)."""
        return list(self._parameters.values()) + list(self._buffers.values())

    def _moved_to(self, backend: Backend) -> None:
        """Called after this operator moved to ``backend``; ops drop backend-specific caches here."""

    def astype(self, dtype: Any) -> Operator:
        """Convert parameters and buffers to ``dtype`` (float64 for gradient checks)."""
        for tensor in self._own_tensors():
            tensor.data = tensor.data.astype(dtype)
            if tensor.grad is not None:
                tensor.grad = tensor.grad.astype(dtype)
        _structure_changed()
        for child in self._children.values():
            child.astype(dtype)
        return self

    @property
    def buffer_pool(self) -> BufferPool | TracingPool | None:
        """The buffer pool :meth:`attach_pool` gave this operator (the Trainer's, or the memory profile's
        tracer), or None: :meth:`buffer` then allocates. A composite asks it whether a step is being traced
        (``buffer_pool is not None and buffer_pool.tracing``; named so that a child called ``pool``, as
        a user's CNN often has, stays free) to report the lifetimes of the arrays it hands between children."""
        return self._pool

    def attach_pool(self, pool: BufferPool | TracingPool | None) -> None:
        """Give this operator tree the buffer pool its forward/backward outputs come from."""
        object.__setattr__(self, "_pool", pool)
        for child in self._children.values():
            child.attach_pool(pool)

    def zero_grad(self) -> None:
        for tensor in self.trainable_parameters():
            tensor.zero_grad()

    # ----------------------------------------------------------------- helpers for subclasses
    def buffer(self, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """An output or workspace array owned by this op; reused across steps when a pool is attached."""
        if self._pool is None:
            return self.xp.empty(shape, dtype)
        return self._pool.get(self, key, shape, dtype)

    def grad_target(self, param: Tensor, key: str) -> tuple[Any, bool]:
        """Where to write ``param``'s gradient: ``(array, add)``: ``param.grad`` itself where the runtime guarantees the
        gradients are zero (one micro-batch per step), else a workspace to pass to :meth:`accumulate_grad`."""
        if self.writes_whole_gradient(param):
            return param.grad, False
        return self.buffer(key, param.shape, param.data.dtype), True

    def writes_whole_gradient(self, param: Tensor) -> bool:
        """Whether this backward may write ``param``'s whole gradient straight into ``param.grad``,
        overwriting it: the runtime guarantees the gradients start at zero (one micro-batch per step, no
        layer used twice). A caller that gets True must write every element; the pool then remembers
        ``param``, and the Trainer stops zeroing its gradient before each step (the write replaces it)."""
        pool = self._pool
        if pool is not None and pool.grads_zeroed and param.grad is not None:
            whole = getattr(pool, "whole_gradients", None)  # a pool of another kind may not track them
            if whole is not None:
                whole.add(id(param))
            return True
        return False

    def accumulate_grad(self, param: Tensor, value: Any) -> None:
        """Add ``value`` into ``param.grad`` (allocating it at the first backward); under a Trainer that updates inside
        backward, a parameter it keeps no gradient for (``param.grad`` None) has its update applied from it here."""
        if not param.requires_grad:
            return
        # a pool of another kind (a test's recorder, a plugin's) may have no sink
        sink = None if self._pool is None or param.grad is not None else getattr(self._pool, "gradient_sink", None)
        if sink is not None and sink(param, value):
            return
        if param.grad is None:
            param.grad = value.copy() if value is not None else None
        else:
            param.grad += value

    def check_input(self, x: Any, trailing: tuple[int, ...] | None = None, min_ndim: int = 1) -> None:
        """Raise ShapeError naming this op unless ``x`` is a floating array ending in ``trailing``, of the
        parameters' dtype (:func:`check_array`); an input like the last one accepted passes at once."""
        params = self._parameters
        pdtype = next(iter(params.values())).data.dtype if params else None
        key = (getattr(x, "shape", None), getattr(x, "dtype", None), trailing, min_ndim, pdtype)
        if key != self._checked_input:
            check_array(self, x, trailing, min_ndim, pdtype)
            object.__setattr__(self, "_checked_input", key)

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this operator (saved in model files)."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
