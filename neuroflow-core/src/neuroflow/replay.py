"""Step replay: a steady-state training step recorded once as the array calls it makes, then repeated as those calls.

Once a step is planned, every op writes the same buffers each step, so the
numpy calls of a step differ from the last step's only in the input and the
labels they read. The runtime around them (checking shapes, asking the pool
for buffers, choosing a kernel, walking the model) gives the same answers
every step: for a small model it is a large part of the step (measured: a
quarter of an MLP 784-128-64-10 step at batch 64, one thread). A Trainer
records one step whose ops can say what they did and from then on runs those
calls alone, with the step's input and labels put in place of the recorded
ones. The arithmetic is the same calls on the same arrays, so training is bit
for bit what the ops would compute; the Trainer checks before each replay
that nothing it depends on changed (see ``neuroflow.trainer.step``) and
otherwise runs the ops.

An op takes part with two methods: ``replay_forward(x, y)`` gives the calls
that repeat the forward just run (``x`` to ``y``), ``replay_backward(grad_out,
grad_in)`` those of the backward just run; a loss's ``replay_forward(pred,
target)`` gives one call that returns the loss (NaN to make the runtime run
the loss itself, which then says what is wrong), its ``replay_backward(scale,
grad)`` the calls of its backward. A call is a zero-argument callable
(``functools.partial`` of an array function, or a function of the op's own)
over the arrays of the step just recorded: input and output, parameters,
buffers. It must not read what an earlier call left on the op (another
thread's prediction may have changed it since), only what a call of the same
replayed step set, as forward sets what its backward reads. An op without the methods, or whose
method returns None (a backend's fused kernel, accumulated gradients,
anything decided per step), makes the step run its ops every time. An answer
is trusted only for instances of the class that gives it, or of a subclass
that adds a constructor and nothing else: a user's subclass that overrides
``forward`` or a helper of it is never replayed with its parent's calls.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

Call = Callable[[], Any]


#: What a subclass may define and still be replayed with its parent's calls: a constructor and class bookkeeping
#: (a model written as ``class Net(Sequential)`` with an ``__init__``), nothing that runs in a step.
_NEUTRAL = frozenset({"__init__", "__module__", "__qualname__", "__doc__", "__annotations__", "__dict__",
                      "__weakref__", "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__",
                      "__slots__"})


def trusted(op: object, method: str) -> bool:
    """Whether ``op``'s ``method`` (``replay_forward``, ...) speaks for what ``op`` runs: every class between
    ``type(op)`` and the one defining ``method`` (or one that sets ``replays_as_written = True`` itself: its
    parent's generic calls, such as an activation's ``_forward``, repeat what it runs) adds nothing but a
    constructor, and no attribute of the instance replaces a method (``layer.forward = wrapper``)."""
    cls = type(op)
    for klass in cls.__mro__:
        if method in klass.__dict__ or klass.__dict__.get("replays_as_written"):
            break  # it gives the calls, or vouches that its parent's generic ones repeat what it runs
        if not _NEUTRAL.issuperset(klass.__dict__):
            return False
    else:
        return False
    own = getattr(op, "__dict__", {})
    return not any(callable(getattr(cls, name, None)) for name in own)


class View:
    """What ``replay_forward`` returns for an output that is a view of the input (``Flatten``): no call, and
    ``make(x)`` gives the view of another input (a replayed step's own, when the op reads the step's input)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make = make


def _ask(owner: Any, method: str, *arrays: Any) -> Any:
    """``owner.method(*arrays)`` where ``owner`` has the method, else None (an op that cannot be replayed)."""
    ask = getattr(owner, method, None)
    return None if ask is None else ask(*arrays)


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def _from_step(call: functools.partial[Any], positions: list[tuple[int, int]], names: list[tuple[str, int]],
               arrays: list[Any]) -> Call:
    """A recorded call that read the step's input or labels, as the same call on the arrays in ``arrays`` when
    called (the new step's): one positional argument (what ops record) directly, any others through a loop."""
    func, args, keywords = call.func, call.args, call.keywords
    if len(positions) == 1 and not names:
        (index, which), = positions
        before, after = args[:index], args[index + 1:]
        if keywords:
            return lambda: func(*before, arrays[which], *after, **keywords)
        return lambda: func(*before, arrays[which], *after)

    def again() -> Any:
        values, named = list(args), dict(keywords)
        for index, which in positions:
            values[index] = arrays[which]
        for name, which in names:
            named[name] = arrays[which]
        return func(*values, **named)

    return again


class Recording:
    """The calls one step's ops say they made, in order; ``refused`` names the first op that could not say.

    The runtime starts it (:meth:`start`) with the step's input and labels
    and the pool the ops run on, whose composites then report each layer
    after it ran (:meth:`forward`, :meth:`backward`); it reports the model
    itself (:meth:`model`, after its layers) and the loss (:meth:`loss`,
    :meth:`loss_backward`), then stops it (:meth:`stop`); :meth:`finish`
    gives the :class:`StepReplay`, or None. ``key`` is what the runtime
    will compare before each replay.
    """

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.step_arrays: list[Any] = [None, None]
        self.forward_calls: list[Call] = []
        self.loss_call: Call | None = None
        self.backward_calls: list[Call] = []
        self.refused: str | None = None
        self.chains: list[tuple[Any, list[Any]]] = []  # (composite, the layers it ran): see StepReplay.still
        self.views: list[tuple[int, Callable[[Any], Any]]] = []  # step_arrays[2 + i] = make(step_arrays[source])
        self._pool: Any = None

    def start(self, inputs: Any, labels: Any, pool: Any) -> None:
        self.step_arrays[:] = [inputs, labels]
        self._pool = pool
        pool.recording = self

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.recording = None
            self._pool = None

    def model(self, model: Any, x: Any, y: Any) -> Recording:
        """The model itself, after the layers it ran reported theirs (a chain has nothing of its own)."""
        self.forward(model, x, y)
        return self

    def _add(self, where: list[Call], owner: object, method: str, calls: list[Call] | None) -> None:
        if self.refused is not None:
            return
        if calls is None or not trusted(owner, method):
            self.refused = f"{owner!r}.{method}"
            return
        where.extend(calls)

    def forward(self, op: Any, x: Any, y: Any) -> None:
        if self.refused is None:
            calls = _ask(op, "replay_forward", x, y)
            if isinstance(calls, View):
                source = next((i for i, a in enumerate(self.step_arrays) if a is x), None)
                if source is not None:  # a view of the step's input: made again from each step's own
                    self.views.append((source, calls.make))
                    self.step_arrays.append(y)
                calls = []
            self._add(self.forward_calls, op, "replay_forward", calls)
            layers = getattr(op, "running_layers", None)
            if layers is not None:
                self.chains.append((op, list(layers)))

    def backward(self, op: Any, grad_out: Any, grad_in: Any) -> None:
        if self.refused is None:
            self._add(self.backward_calls, op, "replay_backward", _ask(op, "replay_backward", grad_out, grad_in))

    def loss(self, loss: Any, pred: Any, target: Any) -> Recording:
        call = _ask(loss, "replay_forward", pred, target) if self.refused is None else None
        if call is None or not trusted(loss, "replay_forward"):
            self.refused = self.refused or f"{loss!r}.replay_forward"
        else:
            self.loss_call = call
        return self

    def loss_backward(self, loss: Any, scale: float, grad: Any) -> None:
        if self.refused is None:
            self._add(self.backward_calls, loss, "replay_backward", _ask(loss, "replay_backward", scale, grad))

    def finish(self, output: Any) -> StepReplay | None:
        """The replay of the recorded step (``output``: the model's output buffer), or None when an op refused or a
        call reads the step's input or labels in a way that cannot be redirected (a view of them, a closure)."""
        if self.refused is not None or self.loss_call is None:
            return None
        forward = [self._redirected(c) for c in self.forward_calls]
        loss = self._redirected(self.loss_call)
        backward = [self._redirected(c) for c in self.backward_calls]
        if any(c is None for c in forward) or loss is None or any(c is None for c in backward):
            self.refused = self.refused or "a call that reads a view of the step's input or labels"
            return None
        if any(np.may_share_memory(output, a) for a in self.step_arrays):
            return None  # the model returns (a view of) its input
        replay = StepReplay(forward, loss, backward, self.step_arrays, output)  # type: ignore[arg-type]
        replay.key, replay.chains, replay.views = self.key, self.chains, self.views
        self.step_arrays[:] = [None] * len(self.step_arrays)  # the recorded step's arrays are not kept
        return replay

    def _redirected(self, call: Call) -> Call | None:
        arrays = self.step_arrays
        if isinstance(call, functools.partial):
            positions = [(i, w) for i, a in enumerate(call.args) for w, s in enumerate(arrays) if a is s]
            names = [(k, w) for k, a in call.keywords.items() for w, s in enumerate(arrays) if a is s]
            others = [a for i, a in enumerate(call.args) if all(i != p for p, _ in positions)]
            others += [a for k, a in call.keywords.items() if all(k != n for n, _ in names)]
            if any(self._overlaps(a) for a in others) or self._overlaps_in(call.func):
                return None
            return _from_step(call, positions, names, arrays) if positions or names else call
        return None if self._overlaps_in(call) else call

    def _overlaps(self, value: Any, depth: int = 0) -> bool:
        """Whether ``value`` holds memory of the step's input or labels: an array, or one held in a sequence, a
        partial or a function's closure (a few levels down)."""
        if isinstance(value, np.ndarray):
            return any(a is not None and np.may_share_memory(value, a) for a in self.step_arrays)
        if depth > 3:
            return False
        if isinstance(value, (tuple, list)):
            return any(self._overlaps(v, depth + 1) for v in value)
        if isinstance(value, functools.partial):
            return self._overlaps([value.func, *value.args, *value.keywords.values()], depth + 1)
        cells = getattr(value, "__closure__", None) or ()
        return any(self._overlaps(_contents(c), depth + 1) for c in cells)

    def _overlaps_in(self, function: Any) -> bool:
        """Whether a function's closure (or a method's object) holds the step's arrays: it cannot be redirected."""
        return self._overlaps(function) or self._overlaps(getattr(function, "__self__", None))


class StepReplay:
    """A recorded step: :meth:`forward` (model and loss on the new step's arrays; the loss, or None when it is not
    finite and the runtime should run the step to say why), then :meth:`backward`."""

    __slots__ = ("forward_calls", "loss_call", "backward_calls", "step_arrays", "output", "key", "chains", "views")

    def __init__(self, forward: list[Call], loss: Call, backward: list[Call], step_arrays: list[Any],
                 output: Any) -> None:
        self.forward_calls, self.loss_call, self.backward_calls = forward, loss, backward
        self.step_arrays = step_arrays
        self.output = output
        #: what the runtime checks before each replay (the recording's key; see ``neuroflow.trainer.step``)
        self.key: tuple[Any, ...] = ()
        #: each chain of layers the step ran, with its layers then: a list edited since runs other layers
        self.chains: list[tuple[Any, list[Any]]] = []
        #: views of the step's input or labels that calls read: (which array, how to make the view)
        self.views: list[tuple[int, Callable[[Any], Any]]] = []

    def still(self) -> bool:
        """Whether every chain runs the layers it ran when recorded (``model.layers`` is a list a user may edit)."""
        return all(op.running_layers == layers for op, layers in self.chains)

    def forward(self, x: Any, y: Any) -> float | None:
        arrays = self.step_arrays
        arrays[0], arrays[1] = x, y
        for index, (source, make) in enumerate(self.views, 2):
            arrays[index] = make(arrays[source])
        for call in self.forward_calls:
            call()
        value = float(self.loss_call())
        if math.isfinite(value):
            return value
        arrays[:] = [None] * len(arrays)  # the ops run this step again: the caller's arrays are not kept
        return None

    def backward(self) -> None:
        for call in self.backward_calls:
            call()
        arrays = self.step_arrays
        arrays[:] = [None] * len(arrays)  # the caller's arrays (and views of them) are not kept past the step
