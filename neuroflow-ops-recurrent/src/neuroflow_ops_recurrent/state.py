"""The state a recurrent op carries from one forward to the next: checked when assigned, kept in the op's arrays.

A stateful op starts each forward from the state the previous forward ended
in, detached: no gradient flows into earlier batches.
"""

from __future__ import annotations

from typing import Any

from neuroflow.errors import ShapeError


def checked_state(op: object, value: Any, state_names: tuple[str, ...], hidden_size: int) -> tuple[Any, ...]:
    """``value`` (an array, or one per name in ``state_names``) as a tuple of (batch, hidden_size) arrays;
    a ShapeError that names ``op`` otherwise."""
    pair = len(state_names) > 1
    parts = tuple(value) if pair and not hasattr(value, "shape") else (value,)
    if len(parts) != len(state_names):
        raise ShapeError(f"{op!r}.state takes {len(state_names)} arrays ({', '.join(state_names)})")
    batch = parts[0].shape[0] if getattr(parts[0], "ndim", 0) == 2 else -1
    for name, part in zip(state_names, parts):
        if getattr(part, "shape", None) is None or tuple(part.shape) != (batch, hidden_size):
            raise ShapeError(
                f"{op!r}.state: {name} has shape {getattr(part, 'shape', type(part).__name__)}; "
                f"expected (batch, {hidden_size})"
            )
    return parts


def carried(xp: Any, state: tuple[Any, ...] | None, final: tuple[Any, ...]) -> tuple[Any, ...]:
    """``final`` copied into ``state``'s arrays, or into new ones when there are none of its shape and dtype:
    the state outlives the step, and a planned pool reuses a buffer's memory once its op's backward is done."""
    if state is None or state[0].shape != final[0].shape or state[0].dtype != final[0].dtype:
        state = tuple(xp.empty(part.shape, part.dtype) for part in final)
    for target, part in zip(state, final):
        target[...] = part
    return state
