"""DetectionEvaluator: the detector's validation metric, fed one batch of raw outputs at a time.

The Trainer hands it each validation batch's model output and padded targets
(host arrays); it decodes, runs NMS at the evaluation settings, clips the
boxes to the image (as YOLOv5's evaluation does) and keeps the detections and
the ground truth, so ``result()`` is the mAP@0.5 of everything added and
``write_coco_json`` writes the same data as COCO files; ``objects`` gives
``neuroflow predict`` the boxes to draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from neuroflow.errors import ShapeError
from neuroflow_ops_vision.detection.boxes import decode
from neuroflow_ops_vision.detection.metric import mean_average_precision, write_coco_json
from neuroflow_ops_vision.detection.nms import non_max_suppression

METRIC_NAME = "mAP@0.5"


class DetectionEvaluator:
    """Collects detections and ground truth over batches; ``result()`` -> {"mAP@0.5": value}.

    ``anchors`` (A, 2) pixels, ``stride`` pixels per cell and ``num_classes``
    describe the head; ``conf``, ``iou`` and ``max_det`` are NMS's evaluation
    settings. Padding rows of the targets (class -1) are dropped.

    Example::

        evaluator = DetectionEvaluator(model.anchors, model.stride, model.num_classes)
        for images, targets in batches:
            evaluator.add(model_output(images), targets)
        evaluator.result()  # {"mAP@0.5": 0.93}
    """

    def __init__(self, anchors: Any, stride: int, num_classes: int, conf: float = 0.001, iou: float = 0.6,
                 max_det: int = 300) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ValueError(f"DetectionEvaluator got num_classes={num_classes!r}; expected a positive integer")
        self.anchors = np.asarray(anchors, dtype=np.float32)
        self.stride = stride
        self.num_classes = int(num_classes)
        self.conf, self.iou, self.max_det = conf, iou, max_det
        self.image_size: tuple[int, int] | None = None  # (height, width) pixels, known from the first batch
        self.detections: list[np.ndarray] = []  # per image (k, 6): x1, y1, x2, y2, score, class
        self.ground_truth: list[np.ndarray] = []  # per image (k, 5): class, x1, y1, x2, y2

    def reset(self) -> None:
        """Forgets everything added (a new validation pass)."""
        self.detections, self.ground_truth, self.image_size = [], [], None

    def add(self, output: Any, targets: Any) -> None:
        """Adds one batch: raw head output (B, A*(5+C), H, W) and padded targets (B, M, 5), host arrays."""
        output = np.asarray(output)
        targets = np.asarray(targets, dtype=np.float32)
        channels = self.anchors.shape[0] * (5 + self.num_classes)
        if output.ndim != 4 or output.shape[1] != channels:
            raise ShapeError(f"DetectionEvaluator got an output of shape {output.shape}; expected (B, {channels}, H, W) "
                             f"for {self.anchors.shape[0]} anchors and {self.num_classes} classes")
        if targets.ndim != 3 or targets.shape[2] != 5 or targets.shape[0] != output.shape[0]:
            raise ShapeError(f"DetectionEvaluator got targets of shape {targets.shape} for {output.shape[0]} images; "
                             f"expected ({output.shape[0]}, M, 5) rows of class, x1, y1, x2, y2 (class -1: padding)")
        height, width = output.shape[2] * self.stride, output.shape[3] * self.stride
        self.image_size = (height, width)
        limits = np.array([width, height, width, height], dtype=np.float32)
        for found in non_max_suppression(decode(output, self.anchors, self.stride), self.conf, self.iou,
                                         self.max_det):
            np.clip(found[:, :4], 0.0, limits, out=found[:, :4])
            self.detections.append(found)
        self.ground_truth.extend(image[image[:, 0] >= 0] for image in targets)

    def result(self) -> dict[str, float]:
        """{"mAP@0.5": COCO's AP@0.5 over every image added} (-1.0 when no image had an object)."""
        return {METRIC_NAME: mean_average_precision(self.detections, self.ground_truth, 0.5, self.num_classes)}

    def objects(self, predictions: Any, agnostic: bool = True, conf: float | None = None,
                iou: float = 0.45) -> list[np.ndarray]:
        """The objects in decoded predictions (B, N, 5+C), e.g. ``Trainer.predict``'s output: what ``neuroflow
        predict`` draws.

        Per image a float32 (k, 6) array (x1, y1, x2, y2, score, class) by
        descending score, after NMS as YOLOv5 detects (each box's best class
        only, IoU 0.45); with ``agnostic`` (the default) boxes of every class
        suppress each other, so one object is one box even when two classes
        score alike. ``conf`` defaults to the evaluation's 0.001, so the
        caller chooses the lowest score to show: NMS suppresses only from
        higher to lower scores, so filtering afterwards equals NMS at that
        threshold.
        """
        threshold = self.conf if conf is None else conf
        return non_max_suppression(np.asarray(predictions), threshold, iou, self.max_det, multi_label=False,
                                   agnostic=agnostic)

    def write_coco_json(self, directory: str | Path) -> tuple[Path, Path]:
        """DIRECTORY/ground_truth.json and DIRECTORY/detections.json of everything added."""
        if self.image_size is None:
            raise ValueError("DetectionEvaluator.write_coco_json: nothing was added yet; call add() first")
        return write_coco_json(directory, self.ground_truth, self.detections, self.image_size, self.num_classes)
