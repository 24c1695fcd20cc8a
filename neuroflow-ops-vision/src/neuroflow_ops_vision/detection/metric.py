"""mAP@0.5 as COCO computes it, and the COCO json files pycocotools reads.

``mean_average_precision`` follows ``pycocotools.cocoeval.COCOeval`` for the
bounding-box AP at one IoU threshold, area "all" (its ``stats[1]`` for IoU
0.5), and agrees with it to rounding:

* per image and category the detections are ranked by score (stable: equal
  scores keep their order in the image's array) and only the first
  ``max_dets`` (100, COCO's largest maxDets) count;
* IoU is computed on (x, y, w, h) boxes without COCO's old ``+1``;
* greedy matching per image and category: each detection in score order takes
  the still unmatched ground-truth box of its class with the highest IoU
  >= ``iou`` (on equal IoUs the later box, as COCO's loop does); a box is
  matched once;
* an unmatched detection whose w*h is outside COCO's area range "all"
  [0, 1e10] (an inverted box, x2 < x1 or y2 < y1) is ignored, neither true
  nor false positive, as COCO does;
* per category, the detections of all images (image after image, then by
  score, stably) give the precision/recall curve; precision is made
  monotone and read at COCO's 101 recall points 0, 0.01, ..., 1 (0 beyond
  the largest recall reached); AP is their mean;
* categories without ground truth are left out of the mean. With no ground
  truth at all there is nothing to average: the result is -1.0, as COCO's
  summary prints.

No detections at all gives 0.0 wherever there is ground truth (every
category's precision is 0); pycocotools itself cannot load an empty result
list, so that case follows this definition.

Ground truth of one image is a (k, 5) array (class, x1, y1, x2, y2);
detections of one image a (k, 6) array (x1, y1, x2, y2, score, class);
image i of both lists is the same image. In the COCO files image ids are the
list positions 0, 1, ..., category ids the class ids, annotation ids 1, 2, ...
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neuroflow.errors import ShapeError

# COCO's recall thresholds, computed as pycocotools does so searchsorted sees the same numbers
RECALL_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
COCO_MAX_DETS = 100  # the maxDets of COCO's AP at IoU=.50 (stats[1])
AREA_ALL = (0.0**2, 1e5**2)  # COCO's area range "all"


def _checked(arrays: Sequence[Any], columns: int, what: str, layout: str) -> list[np.ndarray]:
    checked = []
    for number, array in enumerate(arrays):
        array = np.asarray(array, dtype=np.float64)
        if array.size == 0:
            array = array.reshape(0, columns)
        if array.ndim != 2 or array.shape[1] != columns:
            raise ShapeError(f"{what} of image {number} has shape {array.shape}; expected (k, {columns}): {layout}")
        if not np.isfinite(array).all():
            raise ValueError(f"{what} of image {number} has non-finite values")
        checked.append(array)
    return checked


def _check_classes(classes: np.ndarray, number: int, what: str, num_classes: int | None) -> None:
    if classes.size == 0:
        return
    bad = (classes != np.round(classes)) | (classes < 0)
    if num_classes is not None:
        bad |= classes >= num_classes
    if bad.any():
        allowed = "non-negative integers" if num_classes is None else f"integers in [0, {num_classes})"
        hint = " (padding rows? drop rows with class -1 first)" if (classes == -1).any() else ""
        raise ValueError(f"{what} of image {number} has class {classes[bad][0]:g}; expected {allowed}{hint}")


def check_ground_truth(ground_truth: Sequence[Any], num_classes: int | None = None) -> list[np.ndarray]:
    """Float64 copies of per-image (k, 5) ground truth; clear errors for bad shapes, classes or boxes."""
    checked = _checked(ground_truth, 5, "ground truth", "class, x1, y1, x2, y2")
    for number, boxes in enumerate(checked):
        _check_classes(boxes[:, 0], number, "ground truth", num_classes)
        empty = (boxes[:, 3] <= boxes[:, 1]) | (boxes[:, 4] <= boxes[:, 2])
        if empty.any():
            raise ValueError(f"ground truth of image {number} has a zero-area box {boxes[empty][0, 1:].tolist()}; "
                             f"expected x1 < x2 and y1 < y2")
    return checked


def check_detections(detections: Sequence[Any], num_classes: int | None = None) -> list[np.ndarray]:
    """Float64 copies of per-image (k, 6) detections; clear errors for bad shapes or classes."""
    checked = _checked(detections, 6, "detections", "x1, y1, x2, y2, score, class")
    for number, boxes in enumerate(checked):
        _check_classes(boxes[:, 5], number, "detections", num_classes)
    return checked


def _xywh(x1: np.ndarray, y1: np.ndarray, x2: np.ndarray, y2: np.ndarray) -> np.ndarray:
    """(n, 4) COCO boxes from float64 corners: the numbers the json files hold and the metric uses."""
    return np.stack([x1, y1, x2 - x1, y2 - y1], axis=1)


def _coco_iou(dets: np.ndarray, gts: np.ndarray) -> np.ndarray:
    """(D, G) IoU of COCO (x, y, w, h) boxes, as pycocotools' bbIou computes it."""
    width = np.minimum(dets[:, None, 2] + dets[:, None, 0], gts[None, :, 2] + gts[None, :, 0])
    width -= np.maximum(dets[:, None, 0], gts[None, :, 0])
    height = np.minimum(dets[:, None, 3] + dets[:, None, 1], gts[None, :, 3] + gts[None, :, 1])
    height -= np.maximum(dets[:, None, 1], gts[None, :, 1])
    inter = width * height
    union = (dets[:, 2] * dets[:, 3])[:, None] + (gts[:, 2] * gts[:, 3])[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / union
    return np.where((width > 0) & (height > 0), iou, 0.0)


def _match_image(det_boxes: np.ndarray, det_classes: np.ndarray, gt_boxes: np.ndarray, gt_classes: np.ndarray,
                 threshold: float) -> np.ndarray:
    """True positives of one image's detections (given in the order COCO visits them) by greedy matching."""
    matched = np.zeros(det_boxes.shape[0], dtype=bool)
    if det_boxes.shape[0] == 0 or gt_boxes.shape[0] == 0:
        return matched
    iou = _coco_iou(det_boxes, gt_boxes)
    iou[det_classes[:, None] != gt_classes[None, :]] = -1.0
    taken = np.zeros(gt_boxes.shape[0], dtype=bool)
    last = gt_boxes.shape[0] - 1
    for det in np.flatnonzero((iou >= threshold).any(axis=1)):
        row = np.where(taken, -1.0, iou[det])
        best = last - int(np.argmax(row[::-1]))  # the later box on equal IoUs, as COCO's loop
        if row[best] >= threshold:
            matched[det] = True
            taken[best] = True
    return matched


def _average_precision(scores: np.ndarray, true_positive: np.ndarray, ground_truths: int) -> float:
    """COCO's 101-point interpolated AP of one category's detections (image-major order) and its gt count."""
    order = np.argsort(-scores, kind="mergesort")
    hits = true_positive[order]
    tp = np.cumsum(hits, dtype=np.float64)
    fp = np.cumsum(~hits, dtype=np.float64)
    if tp.size == 0:
        return 0.0
    recall = tp / ground_truths
    precision = tp / (fp + tp + np.spacing(1))
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    points = np.searchsorted(recall, RECALL_THRESHOLDS, side="left")
    reached = points < tp.size
    return float(np.where(reached, precision[np.minimum(points, tp.size - 1)], 0.0).mean())


def average_precisions(detections: Sequence[Any], ground_truth: Sequence[Any], iou: float = 0.5,
                       num_classes: int | None = None, max_dets: int = COCO_MAX_DETS) -> dict[int, float]:
    """AP at IoU ``iou`` of every class that has ground truth, as COCOeval computes it (see the module)."""
    if len(detections) != len(ground_truth):
        raise ValueError(f"got detections for {len(detections)} images and ground truth for {len(ground_truth)}; "
                         f"expected one entry per image in both")
    if not 0.0 < iou <= 1.0:
        raise ValueError(f"got iou={iou!r}; expected an IoU threshold in (0, 1]")
    if isinstance(max_dets, bool) or not isinstance(max_dets, (int, np.integer)) or max_dets < 1:
        raise ValueError(f"got max_dets={max_dets!r}; expected a positive integer")
    dets = check_detections(detections, num_classes)
    gts = check_ground_truth(ground_truth, num_classes)
    threshold = min(iou, 1 - 1e-10)  # COCO's bound, so IoU 1.0 still matches exact boxes

    det_image = np.repeat(np.arange(len(dets)), [d.shape[0] for d in dets])
    det = np.concatenate([np.zeros((0, 6)), *dets])
    det_class = det[:, 5].astype(np.int64)
    # COCO's visiting order: image, class, score (stable); keep the first max_dets per image and class
    order = np.lexsort((np.arange(det.shape[0]), -det[:, 4], det_class, det_image))
    det, det_class, det_image = det[order], det_class[order], det_image[order]
    group = det_image * (int(det_class.max(initial=0)) + 1) + det_class
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if group.size else np.zeros(0, np.int64)
    rank = np.arange(group.size) - np.repeat(starts, np.diff(np.r_[starts, group.size]))
    kept = rank < max_dets
    det, det_class, det_image = det[kept], det_class[kept], det_image[kept]
    det_boxes = _xywh(det[:, 0], det[:, 1], det[:, 2], det[:, 3])

    bounds = np.searchsorted(det_image, np.arange(len(dets) + 1))
    true_positive = np.zeros(det.shape[0], dtype=bool)
    for image, truth in enumerate(gts):
        lo, hi = bounds[image], bounds[image + 1]
        true_positive[lo:hi] = _match_image(det_boxes[lo:hi], det_class[lo:hi],
                                            _xywh(truth[:, 1], truth[:, 2], truth[:, 3], truth[:, 4]),
                                            truth[:, 0].astype(np.int64), threshold)

    # COCO's area range "all" ignores an unmatched detection whose w*h is outside [0, 1e10] (an inverted box)
    area = det_boxes[:, 2] * det_boxes[:, 3]
    counted = true_positive | ((area >= AREA_ALL[0]) & (area <= AREA_ALL[1]))
    gt_classes = np.concatenate([np.zeros(0, np.int64), *(t[:, 0].astype(np.int64) for t in gts)])
    classes, counts = np.unique(gt_classes, return_counts=True)
    result = {}
    for category, count in zip(classes.tolist(), counts.tolist(), strict=True):
        mine = (det_class == category) & counted
        result[category] = _average_precision(det[mine, 4], true_positive[mine], count)
    return result


def mean_average_precision(detections: Sequence[Any], ground_truth: Sequence[Any], iou: float = 0.5,
                           num_classes: int | None = None, max_dets: int = COCO_MAX_DETS) -> float:
    """mAP at IoU ``iou`` (COCO's AP@0.5 by default): the mean AP over classes with ground truth; -1.0 if none.

    ``detections``: per image a (k, 6) array (x1, y1, x2, y2, score, class);
    ``ground_truth``: per image a (k, 5) array (class, x1, y1, x2, y2), no
    padding rows. ``num_classes``, when given, makes class ids outside
    [0, num_classes) an error. Agrees with pycocotools' ``COCOeval`` bbox
    ``stats[1]`` (see the module docstring for the rules).

    Example::

        mean_average_precision(non_max_suppression(decoded), ground_truth)  # 0.0 .. 1.0
    """
    per_class = average_precisions(detections, ground_truth, iou, num_classes, max_dets)
    return float(np.mean(list(per_class.values()))) if per_class else -1.0


def coco_ground_truth(ground_truth: Sequence[Any], image_size: int | tuple[int, int],
                      num_classes: int | None = None) -> dict[str, Any]:
    """A COCO instances dict of the ground truth; ``image_size`` is S or (height, width) pixels.

    Categories are 0 .. num_classes-1 when ``num_classes`` is given, else the
    classes that occur. Boxes are [x, y, w, h], area w*h, iscrowd 0.
    """
    height, width = (image_size, image_size) if isinstance(image_size, (int, np.integer)) else image_size
    gts = check_ground_truth(ground_truth, num_classes)
    annotations: list[dict[str, Any]] = []
    for image, truth in enumerate(gts):
        boxes = _xywh(truth[:, 1], truth[:, 2], truth[:, 3], truth[:, 4])
        for label, box in zip(truth[:, 0].astype(np.int64).tolist(), boxes.tolist(), strict=True):
            annotations.append({"id": len(annotations) + 1, "image_id": image, "category_id": label, "bbox": box,
                                "area": box[2] * box[3], "iscrowd": 0})
    present = sorted({a["category_id"] for a in annotations})
    categories = list(range(num_classes)) if num_classes is not None else present
    return {
        "info": {"description": "NeuroFlow detection ground truth"},
        "images": [{"id": image, "width": int(width), "height": int(height)} for image in range(len(gts))],
        "annotations": annotations,
        "categories": [{"id": label, "name": str(label)} for label in categories],
    }


def coco_detections(detections: Sequence[Any], num_classes: int | None = None) -> list[dict[str, Any]]:
    """COCO results: one {image_id, category_id, bbox [x, y, w, h], score} per detection."""
    results = []
    for image, found in enumerate(check_detections(detections, num_classes)):
        boxes = _xywh(found[:, 0], found[:, 1], found[:, 2], found[:, 3])
        for box, score, label in zip(boxes.tolist(), found[:, 4].tolist(), found[:, 5].astype(np.int64).tolist(),
                                     strict=True):
            results.append({"image_id": image, "category_id": label, "bbox": box, "score": score})
    return results


def write_coco_json(directory: str | Path, ground_truth: Sequence[Any], detections: Sequence[Any],
                    image_size: int | tuple[int, int], num_classes: int | None = None) -> tuple[Path, Path]:
    """Writes DIRECTORY/ground_truth.json (COCO instances) and DIRECTORY/detections.json (COCO results).

    Returns the two paths. pycocotools reads them with
    ``COCO("ground_truth.json").loadRes("detections.json")``.
    """
    if len(detections) != len(ground_truth):
        raise ValueError(f"got detections for {len(detections)} images and ground truth for {len(ground_truth)}; "
                         f"expected one entry per image in both")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    truth_path, found_path = folder / "ground_truth.json", folder / "detections.json"
    truth_path.write_text(json.dumps(coco_ground_truth(ground_truth, image_size, num_classes)))
    found_path.write_text(json.dumps(coco_detections(detections, num_classes)))
    return truth_path, found_path
