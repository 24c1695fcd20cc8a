"""Composite operators: Sequential, Residual and Concat.

Backward is pulled: each composite walks its children in reverse and hands
every child the gradient of its output. Nothing is recorded at run time.
"""

from __future__ import annotations

from typing import Any

from neuroflow import debug, folding
from neuroflow.errors import ConfigError, ShapeError
from neuroflow.operator import MemoryDeclaration, Operator


def input_layer(model: Operator) -> Operator | None:
    """The layer that first reads the model's input (through nested Sequentials), or None if not a chain."""
    first = model
    while isinstance(first, Sequential) and len(first):
        first = first[0]
    return None if first is model else first


def _skips_input_grad(layer: Operator) -> bool:
    """Whether ``layer`` returns no input gradient by design: it, or the leaf that first reads its input (a nested
    chain's), was told its input needs none (the model's first layer)."""
    return (input_layer(layer) or layer).needs_input_grad is False


def report_forward_read(pool: Any, producer: Operator, consumer: Operator, x: Any, y: Any) -> None:
    """Tell a tracing ``pool`` that ``consumer``'s forward read ``x``, ``producer``'s output, and returned ``y``.

    An output its producer's backward does not read dies with its consumer:
    now, or when the consumer is done if the consumer's backward reads it.
    """
    if not producer.backward_reads_output:
        pool.drop(x, y, consumer if consumer.backward_reads_input else None)


def _keeper_to_refill(producer: Operator, consumer: Operator, x: Any) -> Operator | None:
    """The op to hand ``x`` again in backward when ``x``, ``producer``'s output that ``consumer``'s forward has just
    read, may be let go until then: the producer can write it again, and the one op that reads it in backward keeps
    exactly it as its saved input (so nothing else points at the memory the plan gives away); else None."""
    if not producer.writes_output_again():
        return None
    keeper = consumer.input_keeper()
    return keeper if keeper is not None and keeper.saved_input is x else None


def read_on_pool(pool: Any, producer: Operator, consumer: Operator, x: Any, y: Any, let_go: bool) -> Operator | None:
    """On a step's ``pool``, ``consumer``'s forward has read ``x``, ``producer``'s output, and returned ``y``. With
    ``let_go`` (training, recomputation on), where it can (see :func:`_keeper_to_refill`), ``x`` dies now and the
    op to hand it again in backward is returned: backward calls ``keeper.save_input(producer.write_output_again())``
    before the consumer's backward. Else None, ``x`` kept as :func:`report_forward_read` tells a tracing pool."""
    keeper = _keeper_to_refill(producer, consumer, x) if let_go else None
    if pool.tracing:
        if keeper is not None:
            pool.drop(x, y)  # dies now: backward writes it again
        else:
            report_forward_read(pool, producer, consumer, x, y)
    return keeper


class Sequential(Operator):
    """Children applied in order; backward runs them in reverse.

    ``Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 10))``
    """

    #: Whether a training step lets go of the outputs its layers can write again (see :meth:`_planned_forward`);
    #: False keeps every output from forward to backward, for one Sequential (set it on the instance).
    recompute_outputs: bool = True

    def __init__(self, *layers: Operator) -> None:
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Operator):
                raise TypeError(f"Sequential item {i} is {type(layer).__name__}; expected an Operator")
            first = next(j for j, other in enumerate(layers) if other is layer)
            if first != i:  # its second forward would overwrite what the first one's backward reads
                raise ConfigError(
                    f"Sequential items {first} and {i} are the same {layer!r}: an op keeps the state of its last "
                    f"forward for its backward, so each place in a model needs an instance of its own; create a "
                    f"{type(layer).__name__} for each (PyTorch code often reuses one activation module)"
                )
            setattr(self, str(i), layer)
        self.layers: list[Operator] = list(layers)
        self._input_shapes: list[tuple[int, ...]] = []
        self._fused: tuple[tuple[Operator, ...], list[Operator]] | None = None  # (layers fused, what runs)
        self._inference: tuple[tuple[Operator, ...], list[Operator]] | None = None  # (the run, folded)
        self._recomputed: tuple[tuple[int, Operator], ...] = ()  # (layer, keeper) whose input forward let go

    def run_as(self, run: list[Operator]) -> None:
        """Execute ``run`` in place of the layers: the same computation regrouped (activations run inside
        their neighbours, see :mod:`neuroflow.fusion`), until the layers change. The layers themselves,
        the configuration and saved files stay as they are; ``run`` equal to the layers runs them again."""
        self._fused = None if list(run) == self.layers else (tuple(self.layers), list(run))

    @property
    def running_layers(self) -> list[Operator]:
        """The layers as they execute now: what :meth:`run_as` set while the layers are unchanged (see
        :mod:`neuroflow.layout_pass`, which plans on top of fusion's run), else the layers."""
        return self._run

    @property
    def _run(self) -> list[Operator]:
        """The layers as they execute: as :meth:`run_as` regrouped them when nothing changed since."""
        fused = self._fused  # operators compare by identity, so equal tuples hold the very same layers
        return fused[1] if fused is not None and fused[0] == tuple(self.layers) else self.layers

    @property
    def backward_reads_input(self) -> bool:  # type: ignore[override]
        return not self.layers or self.layers[0].backward_reads_input

    @property
    def backward_reads_output(self) -> bool:  # type: ignore[override]
        return not self.layers or self.layers[-1].backward_reads_output

    @property
    def _inference_run(self) -> list[Operator]:
        """The run with its normalisations folded into the ops before them (:mod:`neuroflow.folding`), made
        again whenever the run changes."""
        run = self._run
        held = self._inference
        if held is None or held[0] != tuple(run):
            held = self._inference = (tuple(run), folding.folded_layers(run))
        return held[1]

    def forward(self, x: Any) -> Any:
        run = self._inference_run if folding.active() else self._run
        pool = self._pool
        self._recomputed = ()
        if pool is not None and (pool.tracing or self.training):
            return self._planned_forward(x, pool, run)
        if debug.enabled():
            self._input_shapes = []
            for layer in run:
                self._input_shapes.append(tuple(x.shape))
                x = layer.forward(x)
            return x
        for layer in run:
            x = layer.forward(x)
        return x

    def _planned_forward(self, x: Any, pool: Any, run: list[Operator]) -> Any:
        """Forward on a pool's buffers (a Trainer's step). In training, an output that its producer can write
        again (:meth:`~Operator.writes_output_again`) and that its consumer keeps only as its saved input
        (:meth:`~Operator.input_keeper`) is let go until backward, which writes it again just before the
        consumer's: one elementwise pass (a BatchNorm's) buys the memory of a feature map between forward and
        backward. A tracing pool is told of each output as it is read (see :func:`report_forward_read`)."""
        recording = getattr(pool, "recording", None)
        shapes: list[tuple[int, ...]] | None = [] if debug.enabled() else None
        recomputed: list[tuple[int, Operator]] = []  # (consumer's index, its keeper): no arrays kept
        let_go = self.training and self.recompute_outputs
        producer: Operator | None = None
        for index, layer in enumerate(run):
            if shapes is not None:
                shapes.append(tuple(x.shape))
            y = layer.forward(x)
            if recording is not None:
                recording.forward(layer, x, y)
            if producer is not None:
                keeper = read_on_pool(pool, producer, layer, x, y, let_go)
                if keeper is not None:
                    recomputed.append((index, keeper))
            producer, x = layer, y
        if shapes is not None:
            self._input_shapes = shapes
        self._recomputed = tuple(recomputed)
        return x

    def backward(self, grad_out: Any) -> Any:
        g = grad_out
        pool = self._pool
        run = self._run
        if self._recomputed or (pool is not None and pool.tracing):
            return self._planned_backward(g, pool, run)
        if debug.enabled() and self._input_shapes:
            for layer, shape in zip(reversed(run), reversed(self._input_shapes)):
                g = layer.backward(g)
                if g is None and _skips_input_grad(layer):
                    break
                debug.check_gradient_shape(layer, shape, g)
            return g
        recording = getattr(pool, "recording", None)
        for layer in reversed(run):
            produced = layer.backward(g)
            if recording is not None:
                recording.backward(layer, g, produced)
            g = produced
            if g is None:  # the first layer skipped its input gradient
                break
        return g

    def _planned_backward(self, grad_out: Any, pool: Any, run: list[Operator]) -> Any:
        """Backward after :meth:`_planned_forward`: each output it let go written again before its consumer's
        backward, each layer's handoff told to a tracing pool."""
        tracing = pool is not None and pool.tracing
        again = dict(self._recomputed)
        shapes = self._input_shapes if debug.enabled() and len(self._input_shapes) == len(run) else None
        g = grad_out
        for index in reversed(range(len(run))):
            layer = run[index]
            if index in again:  # the producer's output, written again, for the keeper and the producer's backward
                again[index].save_input(run[index - 1].write_output_again())
            produced = layer.backward(g)
            if tracing:
                pool.handoff(g, produced, layer)
            if shapes is not None and not (produced is None and _skips_input_grad(layer)):
                debug.check_gradient_shape(layer, shapes[index], produced)
            g = produced
            if g is None:  # the first layer skipped its input gradient
                break
        return g

    def replay_forward(self, x: Any, y: Any) -> list[Any] | None:
        """Nothing of its own: the layers it ran reported their calls (None when it let an output go)."""
        return None if self._recomputed or debug.enabled() else []

    def replay_backward(self, grad_out: Any, grad_in: Any) -> list[Any] | None:
        return None if self._recomputed or debug.enabled() else []

    def writes_output_again(self) -> bool:
        run = self._run
        return bool(run) and run[-1].writes_output_again()

    def write_output_again(self) -> Any:
        return self._run[-1].write_output_again()

    def input_keeper(self) -> Operator | None:
        run = self._run
        return run[0].input_keeper() if run else None

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        for layer in self.layers:
            shape = layer.output_shape(shape)
        return MemoryDeclaration(shape)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> Operator:
        return self.layers[index]

    def __iter__(self) -> Any:
        return iter(self.layers)

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({i}): " + repr(layer).replace("\n", "\n  ") for i, layer in enumerate(self.layers))
        return f"Sequential({inner}\n)"


class Residual(Operator):
    """``x + block(x)``, or ``shortcut(x) + block(x)`` when the block changes the shape."""

    def __init__(self, block: Operator, shortcut: Operator | None = None) -> None:
        super().__init__()
        self.block = block
        if shortcut is not None:
            self.shortcut = shortcut
        self.has_shortcut = shortcut is not None

    def forward(self, x: Any) -> Any:
        h = self.block.forward(x)
        s = self.shortcut.forward(x) if self.has_shortcut else x
        if h.shape != s.shape:
            raise ShapeError(
                f"Residual: block output {h.shape} does not match the shortcut {s.shape}; "
                "pass shortcut=... to project the input"
            )
        y = self.buffer("y", h.shape, h.dtype)
        self.xp.add(h, s, out=y)
        return y

    def backward(self, grad_out: Any) -> Any:
        pool = self._pool
        tracing = pool is not None and pool.tracing
        if tracing:
            pool.keep(grad_out)  # read again below, after the block consumed it
        gb = self.block.backward(grad_out)
        if tracing:
            pool.handoff(None, gb, self.block)
        gs = self.shortcut.backward(grad_out) if self.has_shortcut else grad_out
        if tracing and self.has_shortcut:
            pool.handoff(None, gs, self.shortcut)
        gx = self.buffer("gx", gb.shape, gb.dtype)
        self.xp.add(gb, gs, out=gx)
        if tracing:
            pool.release(gb)
            pool.release(gs)
            pool.release(grad_out, kept=True)
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(self.block.output_shape(tuple(input_shape)))

    def __repr__(self) -> str:
        extra = f", shortcut={self.shortcut!r}" if self.has_shortcut else ""
        return f"Residual({self.block!r}{extra})"


class Concat(Operator):
    """Runs every branch on the same input and concatenates their outputs along ``axis``.

    With ``axis=1`` on NCHW feature maps this is an FPN- or Inception-style
    channel concat.
    """

    def __init__(self, *branches: Operator, axis: int = -1) -> None:
        super().__init__()
        if not branches:
            raise ValueError("Concat needs at least one branch")
        for i, branch in enumerate(branches):
            setattr(self, str(i), branch)
        self.branches = list(branches)
        self.axis = int(axis)
        self._sizes: list[int] = []

    def forward(self, x: Any) -> Any:
        outs = [branch.forward(x) for branch in self.branches]
        rest = {tuple(o.shape[:self.axis % o.ndim]) + tuple(o.shape[self.axis % o.ndim + 1:]) for o in outs}
        if len(rest) != 1:
            raise ShapeError(f"{self!r}: branch outputs {[o.shape for o in outs]} differ outside axis {self.axis}")
        self._sizes = [o.shape[self.axis] for o in outs]
        shape = list(outs[0].shape)
        shape[self.axis] = sum(self._sizes)
        y = self.buffer("y", tuple(shape), outs[0].dtype)
        self.xp.concatenate(outs, axis=self.axis, out=y)
        pool = self._pool
        if pool is not None and pool.tracing:  # copied: an output its branch's backward does not read dies now
            for branch, out in zip(self.branches, outs, strict=True):
                if not branch.backward_reads_output:
                    pool.drop(out, y)
        return y

    def backward(self, grad_out: Any) -> Any:
        pool = self._pool
        tracing = pool is not None and pool.tracing
        gx = None
        start = 0
        for i, (branch, size) in enumerate(zip(self.branches, self._sizes)):
            index = [slice(None)] * grad_out.ndim
            index[self.axis] = slice(start, start + size)
            start += size
            piece = grad_out[tuple(index)]
            part = self.buffer(f"part{i}", piece.shape, piece.dtype)
            part[...] = piece  # branches get a contiguous gradient of their own
            g = branch.backward(part)
            if tracing:
                pool.handoff(part, g, branch)
            if gx is None:
                gx = self.buffer("gx", g.shape, g.dtype)
                gx[...] = g
            else:
                gx += g
            if tracing:
                pool.release(g)
        if tracing:
            pool.release(grad_out)
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shapes = [b.output_shape(tuple(input_shape)) for b in self.branches]
        out = list(shapes[0])
        out[self.axis] = sum(s[self.axis] for s in shapes)
        return MemoryDeclaration(tuple(out))

    def get_config(self) -> dict[str, Any]:
        return {"axis": self.axis}

    def __repr__(self) -> str:
        return f"Concat({', '.join(map(repr, self.branches))}, axis={self.axis})"
