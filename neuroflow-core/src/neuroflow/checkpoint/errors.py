"""CheckpointError: a model file or training checkpoint that cannot be written or read."""

from __future__ import annotations

from neuroflow.errors import NeuroFlowError


class CheckpointError(NeuroFlowError, ValueError):
    """A model file or checkpoint is corrupt, hostile, from a newer NeuroFlow, or does not fit the model.

    Raised before anything large is allocated; the message names the file,
    what was expected and what was found.
    """


def few(names: list[str] | tuple[str, ...], limit: int = 5) -> str:
    """``names`` for an error message (see :func:`printable`): the first ``limit`` and how many more, or ``none``."""
    if not names:
        return "none"
    shown = ", ".join(printable(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def printable(text: str) -> str:
    """``text`` for an error message, each character that does not print escaped (``\\x1b``).

    A name or message from a file may hold control characters or terminal escape sequences; escaped, they
    cannot reach the terminal.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)
