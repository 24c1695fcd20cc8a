"""CheckpointError: a model file or training checkpoint that cannot be written or read."""

from __future__ import annotations

from neuroflow.errors import NeuroFlowError


class CheckpointError(NeuroFlowError, ValueError):
    """A model file or checkpoint is corrupt, hostile, from a newer NeuroFlow, or does not fit the model.

    Raised before anything large is allocated; the message names the file,
    what was expected and what was found.
    """


def few(names: list[str] | tuple[str, ...], limit: int = 5) -> str:
    """``names`` for an error message: the first ``limit`` of them and how many more, or ``none``."""
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
