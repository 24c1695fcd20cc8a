"""Truncated backpropagation through time: the steps one backward reaches and how output gradients enter it.

Truncation (``bptt_steps=k``) is defined per output: the gradient of the
output at step t flows through the cells of steps t, t−1, …, t−k+1 and stops
there; for that output the state entering step t−k+1 is a constant. This is
Williams & Peng's BPTT(k, 1). With one output (many-to-one) that is the last
k steps. With an output at every step, outputs whose windows overlap are
propagated as separate gradient streams — up to k at once, held in a ring
indexed by ``output step mod k`` — so the backward of a step costs k times
the untruncated one. ``bptt_steps=None`` (or k ≥ time) is full BPTT.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Window(NamedTuple):
    """How one backward over a sequence runs."""

    slots: int  # gradient streams held at once
    stop: int  # the first step the backward reaches
    ring: bool  # whether the streams form a ring indexed by output step mod k


def window(bptt_steps: int | None, return_sequences: bool, time: int) -> Window:
    """The backward's window over ``time`` steps for truncation ``bptt_steps`` (None: full BPTT)."""
    k = bptt_steps
    if k is None or k >= time:
        return Window(1, 0, False)
    if return_sequences:
        return Window(k, 0, True)
    return Window(1, time - k, False)


def receive_output_gradient(streams: list[Any], grad_out: Any, t: int, time: int, window: Window,
                            return_sequences: bool) -> None:
    """Put output ``t``'s share of ``grad_out`` into the state-gradient ``streams`` before step t's backward.

    ``streams`` holds one (batch, slots, hidden) array per state component;
    ``grad_out`` is (batch, time, hidden) with ``return_sequences``, else the
    (batch, hidden) gradient of the last step's output.
    """
    if return_sequences:
        if window.ring:  # the slot of output t held output t+k's stream, now past its window
            streams[0][:, t % window.slots] = grad_out[:, t]
            for other in streams[1:]:
                other[:, t % window.slots] = 0
        else:
            streams[0][:, 0] += grad_out[:, t]
    elif t == time - 1:
        streams[0][:, 0] = grad_out
