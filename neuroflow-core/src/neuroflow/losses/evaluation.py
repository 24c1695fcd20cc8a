"""What a loss may add to ``Trainer.evaluate``: an Evaluator that sees every batch's output and targets.

A loss whose task has a metric the mean loss does not give (a detector's
mAP@0.5) returns a fresh :class:`Evaluator` from
:meth:`~neuroflow.losses.base.Loss.evaluator`; ``Trainer.evaluate`` (and so
the per-epoch validation of ``fit`` and ``neuroflow evaluate``) hands it each
batch's model output and targets as host arrays and merges its
:meth:`~Evaluator.result` into the metrics it returns.

Two capabilities are optional; a command that needs one checks for it with
``isinstance`` and names what is missing:

* :class:`WritesCocoJson`: ``write_coco_json(directory)`` writes the data
  it saw and the model's detections as COCO files (``ground_truth.json``,
  ``detections.json``): what ``neuroflow evaluate --coco-json DIR`` asks for.
* :class:`FindsObjects`: ``objects(predictions)`` turns what
  ``Trainer.predict`` returns for a batch into the objects found in each
  image, which ``neuroflow predict`` draws as labelled boxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Evaluator(Protocol):
    """Accumulates a metric over batches: ``add`` each batch, then ``result``.

    One evaluator serves one evaluation: :meth:`Loss.evaluator
    <neuroflow.losses.base.Loss.evaluator>` returns a new one each call.
    """

    def add(self, output: np.ndarray, targets: np.ndarray) -> None:
        """Take one batch: the model's raw output and the batch's targets, both host (numpy) arrays."""
        ...

    def result(self) -> dict[str, float]:
        """The metrics over every batch added so far, by name (``{"mAP@0.5": 0.91}``)."""
        ...


@runtime_checkable
class WritesCocoJson(Protocol):
    """An evaluator that writes what it saw as COCO json, the format pycocotools and other tools read."""

    def write_coco_json(self, directory: str | Path) -> Sequence[Path]:
        """Write ``directory/ground_truth.json`` (COCO instances) and ``directory/detections.json`` (COCO
        results) of everything added; return their paths."""
        ...


@runtime_checkable
class FindsObjects(Protocol):
    """An evaluator whose model finds objects: boxes with a class and a score."""

    def objects(self, predictions: np.ndarray, agnostic: bool = True) -> list[np.ndarray]:
        """The objects in each image of ``Trainer.predict``'s output for a batch (the loss's ``predictions``):
        one float array (k, 6) per image, rows ``(x1, y1, x2, y2, score, class)`` in pixels, by descending score.
        ``agnostic``: one box per object whatever its class (class-agnostic NMS), else per class."""
        ...


def evaluator_of(loss: Any) -> Evaluator | None:
    """A new evaluator from ``loss`` (any object with an ``evaluator()`` method), or None."""
    make = getattr(loss, "evaluator", None)
    return None if make is None else make()
