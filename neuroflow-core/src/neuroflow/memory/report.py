"""MemoryReport: what the memory profile predicts for one training step, as rows, totals and advice.

One row per layer gives the bytes it holds by kind (:data:`KINDS`); the
report adds the arena the planner placed the traced buffers in, and the
largest batch and a batch × accumulation pair under a budget when one was
given. ``str(report)`` is the table ``neuroflow mem-profile`` prints;
:meth:`MemoryReport.to_png` draws it as a heat-map.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from neuroflow.allocators.base import ALIGNMENT
from neuroflow.buffers.planner import Plan
from neuroflow.memory.heatmap import write_heatmap

MiB = 1024 * 1024
KINDS = ("parameters", "gradients", "optimizer", "activations", "workspace", "grads_in_flight")


@dataclass
class LayerRow:
    """Bytes one layer holds, by kind (activations etc. before buffers are shared)."""

    name: str
    op: str
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))


@dataclass
class MemoryReport:
    """What a training step needs: per-layer rows, the arena after sharing, and the predicted peak."""

    batch_size: int
    rows: list[LayerRow]
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    plan: Plan
    budget_bytes: int | None = None
    largest_batch: int | None = None
    suggestion: tuple[int, int] | None = None
    effective_batch: int | None = None
    #: the error-feedback residual of gradient compression (0 without it)
    compression_bytes: int = 0
    #: host memory the data loader holds for this batch size (prefetched batches), counted against a budget
    input_reserve_bytes: int = 0

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    @property
    def static_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes + self.compression_bytes

    @property
    def predicted_peak_bytes(self) -> int:
        return self.static_bytes + self.arena_bytes + ALIGNMENT  # the arena is over-allocated to align it

    def fits(self, reserve_bytes: int | None = None) -> bool:
        """Whether the predicted peak, plus ``reserve_bytes`` kept for input data, is within the budget."""
        reserve = self.input_reserve_bytes if reserve_bytes is None else reserve_bytes
        return self.budget_bytes is None or self.predicted_peak_bytes + reserve <= self.budget_bytes

    def __str__(self) -> str:
        def mb(n: int) -> str:
            return f"{n / MiB:9.3f}"

        head = f"{'layer':<28}{'params':>10}{'grads':>10}{'optim':>10}{'activ':>10}{'work':>10}{'g-flight':>10}  (MiB)"
        lines = [f"memory plan for batch {self.batch_size}", head, "-" * len(head)]
        for row in self.rows:
            label = f"{row.name} {row.op}"[:27]
            lines.append(f"{label:<28}" + "".join(f"{mb(row.bytes[k]):>10}" for k in KINDS))
        lines.append("-" * len(head))
        lines.append(f"parameters + gradients + optimizer state: {self.static_bytes / MiB:.3f} MiB")
        if self.compression_bytes:
            lines.append(f"  of which gradient compression (error-feedback residual): {self.compression_bytes / MiB:.3f} MiB")
        lines.append(
            f"activation arena: {self.arena_bytes / MiB:.3f} MiB (unshared {self.plan.unshared_bytes / MiB:.3f} MiB, "
            f"lower bound {self.plan.max_live_bytes / MiB:.3f} MiB)"
        )
        lines.append(f"predicted peak of a training step: {self.predicted_peak_bytes / MiB:.3f} MiB")
        if self.budget_bytes is not None:
            if self.input_reserve_bytes:
                lines.append(f"input batches the data loader holds: {self.input_reserve_bytes / MiB:.3f} MiB")
            lines.append(f"budget: {self.budget_bytes / MiB:.3f} MiB -> {'fits' if self.fits() else 'does NOT fit'}")
            if self.largest_batch is not None:
                lines.append(f"largest batch that fits: {self.largest_batch}")
            if self.suggestion is not None:
                b, k = self.suggestion
                lines.append(f"to keep the effective batch {self.effective_batch}: batch_size={b} x "
                             f"gradient_accumulation_steps={k} (= {b * k})")
            elif self.largest_batch == 0:
                lines.append("not even batch 1 fits: the parameters and optimizer state alone exceed the budget")
            elif self.largest_batch is not None and self.effective_batch is not None:
                lines.append(f"no batch x accumulation pair keeps the effective batch {self.effective_batch} within "
                             "the budget (accumulating needs a workspace per weight gradient); use "
                             f"batch_size={self.largest_batch} without accumulation, or raise the budget")
        return "\n".join(lines)

    def to_png(self, path: str) -> None:
        """Write a heat-map of layers × memory kinds (needs matplotlib)."""
        write_heatmap(
            path,
            [[row.bytes[k] / MiB for k in KINDS] for row in self.rows],
            rows=[f"{r.name} {r.op}"[:40] for r in self.rows],
            columns=[k.replace("_", " ") for k in KINDS],
            title=f"batch {self.batch_size}: predicted peak {self.predicted_peak_bytes / MiB:.2f} MiB",
        )
