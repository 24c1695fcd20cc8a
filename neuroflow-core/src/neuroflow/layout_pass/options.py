"""LayoutOptions: what an op tells the layout pass about the layouts it can run in (the protocol's data).

An op that can run in more than one layout has ``layout_options()``, which
returns a :class:`LayoutOptions` (None: run as written), and
``with_layout(input_layout, output_layout)``, a context manager under which
its forward, backward and memory declaration use those layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuroflow.operator import Operator


@dataclass(frozen=True)
class LayoutOptions:
    """What an op tells the layout pass: where its maps are as written, and how else it can run.

    ``written`` is (input layout, output layout) as the model is written; a
    side that is not a feature map (a global pool's (N, C) output) is None.
    ``pairs`` lists the (input, output) layouts it can run with (an op whose
    layout the user chose lists only ``written``: a hint is an override).
    ``preferred`` is the layout it computes fastest in, and ``penalty`` what
    each side outside it costs against one conversion (1.0: the op permutes
    that side itself; 0.5: it computes there natively but slower).
    ``convert(source, target)`` builds an op that converts a map between two
    of ``layouts``; ``branches`` are children the op runs on its input, each
    in the op's input and output layouts (the branches of a channel concat).
    ``elementwise`` ops (activations) run in whatever layout they are handed.
    """

    written: tuple[str | None, str | None] = (None, None)
    pairs: tuple[tuple[str | None, str | None], ...] = ()
    preferred: str | None = None
    penalty: float = 0.5
    convert: Callable[[str, str], Operator] | None = None
    layouts: tuple[str, ...] = ()
    branches: tuple[Operator, ...] = ()
    elementwise: bool = False


#: The options of an op that computes each element from the same element of its input.
ELEMENTWISE = LayoutOptions(elementwise=True)


def options_of(op: Operator) -> LayoutOptions | None:
    """``op.layout_options()``, or None for an op that does not implement the protocol (it runs as written)."""
    ask = getattr(op, "layout_options", None)
    return ask() if callable(ask) else None
