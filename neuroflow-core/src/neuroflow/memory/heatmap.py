"""A heat-map of a MemoryReport: layers down, memory kinds across, MiB in each cell."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuroflow.memory.profile import MemoryReport


def write_heatmap(report: MemoryReport, path: str) -> None:
    """Save the report as a PNG heat-map; raises ImportError naming matplotlib when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("the memory heat-map needs matplotlib: pip install matplotlib") from exc
    import numpy as np

    from neuroflow.memory.profile import KINDS, MiB

    values = np.array([[row.bytes[k] / MiB for k in KINDS] for row in report.rows])
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(report.rows) + 2))
    image = ax.imshow(values, cmap="magma_r", aspect="auto")
    ax.set_xticks(range(len(KINDS)), [k.replace("_", " ") for k in KINDS], rotation=30, ha="right")
    ax.set_yticks(range(len(report.rows)), [f"{r.name} {r.op}"[:40] for r in report.rows])
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if values[i, j]:
                ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if values[i, j] > values.max() / 2 else "black")
    fig.colorbar(image, ax=ax, label="MiB")
    ax.set_title(f"batch {report.batch_size}: predicted peak {report.predicted_peak_bytes / MiB:.2f} MiB")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
