"""A heat-map of a table of MiB: rows down (layers), columns across (memory kinds), the value in each cell."""

from __future__ import annotations

from collections.abc import Sequence


def write_heatmap(path: str, mib: Sequence[Sequence[float]], *, rows: Sequence[str], columns: Sequence[str],
                  title: str) -> None:
    """Save ``mib[i][j]`` (row ``rows[i]``, column ``columns[j]``) as a PNG heat-map titled ``title``.

    Raises ImportError naming matplotlib when it is missing.
    """
    # matplotlib is an optional, heavy dependency: imported only when a heat-map is drawn
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("the memory heat-map needs matplotlib: pip install matplotlib") from exc
    import numpy as np

    values = np.array(mib)
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 2))
    image = ax.imshow(values, cmap="magma_r", aspect="auto")
    ax.set_xticks(range(len(columns)), list(columns), rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), list(rows))
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if values[i, j]:
                ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if values[i, j] > values.max() / 2 else "black")
    fig.colorbar(image, ax=ax, label="MiB")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
