"""MemoryReport: what the memory profile predicts for one training step, as rows, totals and advice.

One row per layer gives the bytes it holds by kind (:data:`KINDS`); the
report adds the arena the planner placed the traced buffers in, and the
largest batch and a batch × accumulation pair under a budget when one was
given. ``str(report)`` is the table ``neuroflow mem-profile`` prints;
:meth:`MemoryReport.to_png` draws it as a heat-map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from neuroflow.allocators.base import ALIGNMENT
from neuroflow.buffers.planner import Plan
from neuroflow.memory.heatmap import write_heatmap

MiB = 1024 * 1024
KINDS = ("parameters", "gradients", "optimizer", "activations", "workspace", "grads_in_flight")


def _mib_up(nbytes: int) -> float:
    """``nbytes`` in MiB rounded up to 3 decimals: a budget of that many MiB holds it."""
    return math.ceil(nbytes * 1000 / MiB) / 1000


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
    #: the part of the budget kept for host temporaries of a step and buffers that no plan holds (a Trainer's: 3 %
    #: of the budget and an eighth of the arena), and the share of any budget kept for the temporaries
    margin_bytes: int = 0
    host_margin: float = 0.0
    #: with a budget: the largest batch without accumulation that fits (``largest_batch`` is at the
    #: accumulation asked), and the peak of a step at batch 1 without and with accumulation, input batches
    #: included: what the advice compares the budget with
    largest_single_batch: int | None = None
    batch1_peak_bytes: int | None = None
    batch1_accumulating_peak_bytes: int | None = None

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
        return self.budget_bytes is None or self.predicted_peak_bytes + reserve + self.margin_bytes <= self.budget_bytes

    def why_nothing_fits(self) -> str:
        """What does not fit the budget when no batch × accumulation keeping the effective batch does, with
        the numbers, and what would: the sentence the Trainer's OutOfMemoryError and ``mem-profile`` give."""
        budget, static = self.budget_bytes or 0, self.static_bytes
        share = 1.0 - self.host_margin  # a budget B keeps B × host_margin: a peak P needs B = P / share
        one = _mib_up(int((self.batch1_peak_bytes or 0) / share))
        accumulating = _mib_up(int((self.batch1_accumulating_peak_bytes or 0) / share))
        parts = (f"parameters, gradients and optimizer state take {static / MiB:.3f} MiB; activations, workspace "
                 f"and input batches at batch 1 take {((self.batch1_peak_bytes or 0) - static) / MiB:.3f} MiB more")
        keep = (f" ({accumulating} MiB for batch 1 with accumulation, which keeps the effective batch "
                f"{self.effective_batch})" if (self.effective_batch or 1) > 1 and accumulating > one else "")
        if static >= budget:
            return (f"the budget of {budget / MiB:.3f} MiB does not hold even the part that does not depend on the "
                    f"batch: {parts}. Raise the budget to at least {one} MiB{keep}, or shrink the static part (a "
                    "smaller model, an optimizer with less state such as SGD(momentum=0), frozen weights)")
        if not self.largest_single_batch:
            return (f"the budget of {budget / MiB:.3f} MiB is too small even for batch 1, which needs {one} MiB: "
                    f"{parts}. Raise the budget to at least {one} MiB{keep}")
        return (f"no batch × accumulation keeps the effective batch {self.effective_batch} within "
                f"{budget / MiB:.3f} MiB: accumulating needs a workspace per weight gradient, and batch 1 with "
                f"accumulation needs {accumulating} MiB. batch_size={self.largest_single_batch} with "
                f"gradient_accumulation_steps=1 fits (a smaller effective batch), or raise the budget to "
                f"{accumulating} MiB to keep it")

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
            if self.margin_bytes:
                lines.append(f"kept for host temporaries and buffers no plan holds: {self.margin_bytes / MiB:.3f} MiB")
            lines.append(f"budget: {self.budget_bytes / MiB:.3f} MiB -> {'fits' if self.fits() else 'does NOT fit'}")
            if self.largest_batch is not None:
                lines.append(f"largest batch that fits: {self.largest_batch}")
            if self.suggestion is not None:
                b, k = self.suggestion
                lines.append(f"to keep the effective batch {self.effective_batch}: batch_size={b} x "
                             f"gradient_accumulation_steps={k} (= {b * k})")
            elif self.batch1_peak_bytes is not None and not self.fits():
                lines.append(f"nothing fits: {self.why_nothing_fits()}")
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
