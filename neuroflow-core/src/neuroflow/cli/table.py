"""Plain-text tables for command output: columns padded to their widest cell."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: int = 2) -> str:
    """Rows of cells as aligned lines; the last column is not padded."""
    lines = [list(header)] if header is not None else []
    lines += [list(row) for row in rows]
    if not lines:
        return ""
    widths = [max(len(line[i]) for line in lines if i < len(line)) for i in range(max(map(len, lines)))]
    pad = " " * indent
    out = []
    for line in lines:
        cells = [cell.ljust(widths[i]) if i < len(line) - 1 else cell for i, cell in enumerate(line)]
        out.append(pad + "  ".join(cells).rstrip())
    return "\n".join(out)
