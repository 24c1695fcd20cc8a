"""Inference folding: an eval-mode normalisation after a convolution runs inside the convolution.

In eval mode a BatchNorm2d with running statistics is a fixed per-channel
affine map, ``activation(x · scale + shift)``. After an op that can scale its
output per channel for free (a convolution scales its filters in the copy it
makes of them anyway, and adds the shift where it would add its bias), the
pair computes as one op: the normalisation's own passes over the feature map
and its output buffer are spent no more. Measured on the detector's
``yolo_lite`` (nine Conv/SeparableConv → BatchNorm(ReLU) pairs, batch 1, 2
threads): the BatchNorms took a quarter of a prediction.

Only predict and evaluate fold (:func:`folding` is entered by the Trainer's
inference mode): what they compute has no backward, and a model run in eval
mode by hand (a frozen-statistics fine-tuning, an input gradient) runs its
layers as they are. The model itself never changes: its parameters, buffers,
state dicts and files stay what the user wrote. The two sides of a pair
speak through two methods, so any op can take part:

* a normalisation with ``affine_in_eval`` true has ``inference_affine(dtype)``,
  which returns ``(scale, shift, activation)`` while its output is such a map,
  else None (training, or no running statistics), and the pair then runs
  unfolded;
* a producer with ``folds_affine`` true has ``forward_affine(x, scale, shift,
  activation)``, which computes ``activation(forward(x) · scale + shift)``.

A wrapper that runs an op in its place (a fused activation, a layout plan)
answers for the op it wraps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from neuroflow.operator import Operator

_FOLDING: ContextVar[bool] = ContextVar("neuroflow_folding", default=False)


@contextmanager
def folding() -> Iterator[None]:
    """Within the block (in this thread), Sequentials run their inference run (see :func:`folded_layers`)."""
    token = _FOLDING.set(True)
    try:
        yield
    finally:
        _FOLDING.reset(token)


def active() -> bool:
    """Whether this thread is inside :func:`folding`."""
    return _FOLDING.get()


def run_pair(producer: Operator, norm: Operator, x: Any) -> Any:
    """``norm.forward(producer.forward(x))``, as one ``producer.forward_affine`` while ``norm`` is a fixed affine map
    (for a composite that runs its own pairs, as a ResNet block does, inside :func:`folding`)."""
    affine = norm.inference_affine(x.dtype)  # type: ignore[attr-defined]
    if affine is None:
        return norm.forward(producer.forward(x))
    return producer.forward_affine(x, *affine)  # type: ignore[attr-defined]


class NormFolded(Operator):
    """``producer`` then ``norm``, computed by ``producer.forward_affine`` while ``norm`` is a fixed affine map."""

    producer: Operator
    norm: Operator

    def __init__(self, producer: Operator, norm: Operator) -> None:
        super().__init__()
        # not children: the Sequential that runs the pair owns both, and the model's walks never see this op
        object.__setattr__(self, "producer", producer)
        object.__setattr__(self, "norm", norm)

    @property
    def backward_reads_input(self) -> bool:  # type: ignore[override]
        return self.producer.backward_reads_input

    @property
    def backward_reads_output(self) -> bool:  # type: ignore[override]
        return self.norm.backward_reads_output

    def forward(self, x: Any) -> Any:
        return run_pair(self.producer, self.norm, x)

    def backward(self, grad_out: Any) -> Any:
        raise RuntimeError(f"{self!r} ran for inference (predict or evaluate), which has no backward")

    def __repr__(self) -> str:
        return f"NormFolded({self.producer!r}, {self.norm!r})"


def _folds(producer: Operator, norm: Operator) -> bool:
    return bool(getattr(producer, "folds_affine", False)) and bool(getattr(norm, "affine_in_eval", False))


def folded_layers(layers: Sequence[Operator]) -> list[Operator]:
    """``layers`` with every producer that can apply a per-channel affine map paired with the normalisation after it."""
    run: list[Operator] = []
    for layer in layers:
        previous = run[-1] if run else None
        if previous is not None and not isinstance(previous, NormFolded) and _folds(previous, layer):
            run[-1] = NormFolded(previous, layer)
        else:
            run.append(layer)
    return run
