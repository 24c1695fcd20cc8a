"""The layout pass: a model written in NCHW runs its feature-map chains in the layout its ops compute fastest in.

Vision's convolutions compute channels-last (NHWC) and permute an NCHW input
and output, a copy each way, per layer. :func:`plan_layouts` lets every
Sequential run a chain of such ops in the layout they prefer, converting once
where the chain starts and once where it ends (before a Flatten, or any op
that reads the map as written): inside the op there where it converts by
itself (a convolution reading NCHW and writing NHWC), else by a conversion op.
The choice is a shortest path per chain: a conversion costs a pass over the
map, an op run outside its preferred layout ``penalty`` per side. Nested
Sequentials, Residuals (block and shortcut in the sum's layout) and an op's
``branches`` are planned through their children.

As with :mod:`neuroflow.fusion`, the model is not changed: layers, configs,
parameters, saved files and ONNX export stay as written; an op gets the
planned layouts only for each call (through a :class:`LayoutPlanned`), and
an op the pass does not know sees its maps as written. The protocol an op
implements (``docs/plugins/write-an-op-plugin.md``): ``layout_options()``
returns a :class:`LayoutOptions` (None: run as written), and
``with_layout(input_layout, output_layout)`` a context manager under which
its forward, backward and memory declaration use those layouts.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuroflow.composites import Residual, Sequential
from neuroflow.layout_pass.options import LayoutOptions, options_of
from neuroflow.layout_pass.planned import Conversion, LayoutPlanned, Placement, running, strip, together
from neuroflow.operator import Operator

#: The layout of an array no op of the chain describes as it is written: it must reach its reader unchanged.
AS_WRITTEN = "as written"
#: One pass over a map; a little more than an op's penalty per side, so that an op converting for itself wins a tie.
CONVERSION_COST = 1.001

#: The conversion ops of each planned Sequential, by (entry, exit, place in the run, source, target): a model
#: planned again (the memory profile plans before it traces) keeps the buffers' owners its arena was planned for.
_CONVERTERS: weakref.WeakKeyDictionary[Operator, dict[tuple[Any, ...], Operator]] = weakref.WeakKeyDictionary()


@dataclass
class _Choice:
    """One way to run an op: its input and output layouts, what that costs, and how to apply it (None: as written)."""

    layouts: tuple[str | None, str | None]
    cost: float
    placement: Placement | None


#: The cheapest ways found so far to have the array in each layout: (cost, the layers run and the conversions
#: between them, each still a (source, target) pair).
_Best = dict[str | None, tuple[float, list[Any]]]
#: A chain's cheapest run and its cost.
_ChainPlan = tuple[float, list[Operator]]


class _Planner:
    """Plans one model: each chain's cheapest layouts, memoised per (op, input, output)."""

    def __init__(self, maps: frozenset[str]) -> None:
        self.maps = maps  # the layouts a feature map may take
        self.chains: dict[tuple[int, str | None, str | None], _ChainPlan | None] = {}
        self.layers: dict[int, list[Operator]] = {}

    def layers_of(self, sequential: Sequential) -> list[Operator]:
        if id(sequential) not in self.layers:
            self.layers[id(sequential)] = strip(sequential.running_layers)
        return self.layers[id(sequential)]

    # ------------------------------------------------------------------ what is written
    def written(self, op: Operator) -> tuple[str | None, str | None] | None:
        """The layouts of ``op``'s input and output as written; None when the pass cannot move them."""
        options = options_of(op)
        if options is not None:
            return None if options.elementwise else options.written
        if isinstance(op, Sequential):
            ends = self.positions(self.layers_of(op))
            return None if ends is None else (ends[0], ends[-1])
        if isinstance(op, Residual):
            block = self.written(op.block)
            return block if block is not None and block[0] == block[1] else None
        return None

    def positions(self, layers: list[Operator]) -> list[str | None] | None:
        """The written layout of the array before each layer and after the last; None when they contradict
        each other (the model hands an op a layout it does not expect: it runs as written)."""
        at: list[str | None] = [AS_WRITTEN] * (len(layers) + 1)
        elementwise = [o is not None and o.elementwise for o in map(options_of, layers)]
        for i, layer in enumerate(layers):
            if elementwise[i]:
                at[i + 1] = at[i]
                continue
            written = self.written(layer)
            if written is None:
                continue  # an op the pass does not know: what it returns is as written
            source, target = written
            if source != AS_WRITTEN and at[i] == AS_WRITTEN:  # it gets what it expects, through activations back
                j = i
                at[j] = source
                while j > 0 and elementwise[j - 1] and at[j - 1] == AS_WRITTEN:
                    j -= 1
                    at[j] = source
            elif source not in (AS_WRITTEN, at[i]):
                return None
            at[i + 1] = target
        return at

    # ------------------------------------------------------------------ ways to run one op
    def choices(self, op: Operator, before: str | None, after: str | None) -> list[_Choice]:
        """Every way to run ``op`` between arrays written in ``before`` and ``after``."""
        options = options_of(op)
        if options is not None and options.elementwise:
            return [_Choice((layout, layout), 0.0, None) for layout in self.alternatives(before)]
        if options is not None:
            return self.leaf_choices(op, options)
        if isinstance(op, Sequential):
            return self.sequence_choices(op, before, after)
        if isinstance(op, Residual):
            return self.residual_choices(op)
        return [_Choice((before, after), 0.0, None)]

    def alternatives(self, layout: str | None) -> list[str | None]:
        return sorted(self.maps) if layout in self.maps else [layout]  # type: ignore[return-value]

    def leaf_choices(self, op: Operator, options: LayoutOptions) -> list[_Choice]:
        found = []
        for pair in options.pairs:
            cost = sum(options.penalty for side in pair if side is not None and side != options.preferred)
            own = None if pair == options.written else functools.partial(op.with_layout, *pair)  # type: ignore[attr-defined]
            found.append(self.with_children(pair, cost, own, [(b, options.written) for b in options.branches]))
        return [choice for choice in found if choice is not None]

    def with_children(self, layouts: tuple[str | None, str | None], cost: float, own: Placement | None,
                      children: list[tuple[Operator, tuple[str | None, str | None]]]) -> _Choice | None:
        """A way to run an op in ``layouts`` whose ``children`` (each with its written layouts) run in them too."""
        placements = [] if own is None else [own]
        for child, written in children:
            way = self.run(child, layouts, written)
            if way is None:
                return None
            cost += way.cost
            placements += [] if way.placement is None else [way.placement]
        return _Choice(layouts, cost, _combined(placements))

    def sequence_choices(self, op: Sequential, before: str | None, after: str | None) -> list[_Choice]:
        ends = self.written(op)
        if ends is None:
            return [_Choice((before, after), 0.0, None)]
        source = before if ends[0] == AS_WRITTEN else ends[0]
        target = after if ends[1] == AS_WRITTEN else ends[1]
        default = self.chain(op, ends[0], ends[1])
        default_run = default[1] if default is not None else self.layers_of(op)
        found = []
        for entry in self.alternatives(source):
            for exit_ in self.alternatives(target):
                inner = self.chain(op, ends[0] if entry == source else entry, ends[1] if exit_ == target else exit_)
                if inner is None:
                    continue
                same = (entry, exit_) == (source, target)
                placement = None if same else functools.partial(running, op, inner[1], default_run)
                found.append(_Choice((entry, exit_), inner[0], placement))
        return found

    def residual_choices(self, op: Residual) -> list[_Choice]:
        written = self.written(op)
        if written is None:
            return [_Choice((AS_WRITTEN, AS_WRITTEN), 0.0, None)]
        children = [(op.block, written)] + ([(op.shortcut, written)] if op.has_shortcut else [])
        found = [self.with_children((layout, layout), 0.0, None, children) for layout in self.alternatives(written[0])]
        return [choice for choice in found if choice is not None]

    def run(self, op: Operator, layouts: tuple[str | None, str | None],
            written: tuple[str | None, str | None]) -> _Choice | None:
        """The cheapest way to run ``op``, a child whose input and output are ``written`` so, from ``layouts[0]``
        to ``layouts[1]``; None when it cannot (an op the pass does not know runs only as written)."""
        ways = [c for c in self.choices(op, *written)
                if tuple(w if side == AS_WRITTEN else side for side, w in zip(c.layouts, written)) == layouts]
        return min(ways, key=lambda c: c.cost) if ways else None

    # ------------------------------------------------------------------ one chain
    def chain(self, sequential: Sequential, entry: str | None, exit_: str | None) -> _ChainPlan | None:
        """The cheapest run of ``sequential``'s layers from an input in ``entry`` to an output in ``exit_``."""
        key = (id(sequential), entry, exit_)
        if key not in self.chains:
            self.chains[key] = None  # a Sequential inside itself runs as written
            self.chains[key] = self.shortest(sequential, self.layers_of(sequential), entry, exit_)
        return self.chains[key]

    def shortest(self, host: Sequential, layers: list[Operator], entry: str | None,
                 exit_: str | None) -> _ChainPlan | None:
        at = self.positions(layers)
        if at is None:
            return None
        convert = _converter(layers)
        best: _Best = {entry: (0.0, [])}  # after the layers seen
        for i, layer in enumerate(layers):
            best = self.converted(best, at[i], convert)
            reached: _Best = {}
            for choice in self.choices(layer, at[i], at[i + 1]):
                source, target = (w if side == AS_WRITTEN else side for side, w in zip(choice.layouts, at[i:i + 2]))
                if source not in best:
                    continue
                cost = best[source][0] + choice.cost
                if target not in reached or cost < reached[target][0]:
                    step = layer if choice.placement is None else LayoutPlanned(layer, choice.placement, choice.layouts)
                    reached[target] = (cost, [*best[source][1], step])
            if not reached:
                return None
            best = reached
        best = self.converted(best, at[-1], convert)
        if exit_ not in best:
            return None
        cost, steps = best[exit_]
        made = _CONVERTERS.setdefault(host, {})  # the same converters (buffer owners) each time a model is planned
        run = []
        for i, step in enumerate(steps):
            if isinstance(step, tuple):
                key = (entry, exit_, i, *step)
                if key not in made:
                    made[key] = convert(*step)  # type: ignore[misc]
                step = Conversion(made[key], host)
            run.append(step)
        return cost, run

    def converted(self, best: _Best, written: str | None, convert: Callable[[str, str], Operator] | None) -> _Best:
        """``best`` and what a conversion of the map at this point adds to it."""
        if convert is None or written not in self.maps:
            return best
        out = dict(best)
        for source, (cost, run) in best.items():
            for target in sorted(self.maps - {source}) if source in self.maps else ():
                total = cost + CONVERSION_COST
                if target not in out or total < out[target][0]:
                    out[target] = (total, [*run, (source, target)])  # made a Conversion once chosen
        return out


def _combined(placements: list[Placement]) -> Placement | None:
    return None if not placements else placements[0] if len(placements) == 1 else functools.partial(together, placements)


def _converter(layers: list[Operator]) -> Callable[[str, str], Operator] | None:
    """A conversion any layer of the chain (or a child of one) offers."""
    for layer in layers:
        for module in layer.modules():
            options = options_of(module)
            if options is not None and options.convert is not None:
                return options.convert
    return None


def plan_layouts(model: Operator) -> int:
    """Let every Sequential in ``model`` run its feature-map chains in their ops' preferred layout; returns how
    many layers now run in a layout other than the written one (conversions included).

    Idempotent, and composes with :func:`neuroflow.fusion.fuse` (run it first): each Sequential's run as fusion
    left it is planned again. A Sequential whose layers change afterwards runs its layers as they are.
    """
    options = [o for o in map(options_of, model.modules()) if o is not None]
    planner = _Planner(frozenset(layout for o in options for layout in o.layouts))
    planned = 0
    for module in list(model.modules()):
        if isinstance(module, Sequential):
            layers = planner.layers_of(module)
            ends = planner.written(module)
            plan = planner.chain(module, *ends) if ends is not None else None
            run = plan[1] if plan is not None else layers
            module.run_as(run)
            planned += sum(isinstance(layer, (LayoutPlanned, Conversion)) for layer in run)
    return planned
