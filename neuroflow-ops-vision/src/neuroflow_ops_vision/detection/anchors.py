"""Anchor boxes from the training boxes: k-means over their (width, height) with 1 − IoU as the distance (YOLOv2's)."""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow_ops_vision.detection.targets import check_targets


def kmeans_anchors(ground_truth: Any, k: int = 3, seed: int = 0, *, iterations: int = 100,
                   restarts: int = 4) -> np.ndarray:
    """``k`` anchors (width, height) in pixels, float32 ``(k, 2)`` sorted by area, that fit the boxes best.

    ``ground_truth``: one ``(k, 5)`` array ``(class, x1, y1, x2, y2)`` per
    image, or a padded ``(B, M, 5)`` batch. Boxes are compared by shape only
    (as if they shared a corner): the distance of a box to an anchor is
    ``1 − IoU``. Centres start by k-means++ seeding from
    ``numpy.random.default_rng(seed)``; ``restarts`` runs keep the one with
    the highest mean best IoU. Raises ValueError with fewer than ``k``
    distinct box shapes.

    >>> kmeans_anchors([np.array([[0, 0, 0, 10, 10], [1, 0, 0, 30, 20], [2, 5, 5, 9, 25]])], k=3)
    array([[ 4., 20.],
           [10., 10.],
           [30., 20.]], dtype=float32)
    """
    for name, value in (("k", k), ("iterations", iterations), ("restarts", restarts)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"kmeans_anchors: {name} must be a positive integer; got {value!r}")
    rows = np.concatenate(check_targets(ground_truth) + [np.zeros((0, 5), np.float32)])
    wh = (rows[:, 3:5] - rows[:, 1:3]).astype(np.float64)
    shapes = len(np.unique(wh, axis=0))
    if shapes < k:
        raise ValueError(f"kmeans_anchors needs at least k = {k} distinct box shapes; the ground truth has {shapes} "
                         f"({len(wh)} boxes)")
    rng = np.random.default_rng(seed)
    best, best_fit = wh[:k], -1.0
    for _ in range(restarts):
        centres = _lloyd(wh, _seed_centres(wh, k, rng), iterations)
        fit = float(shape_iou(wh, centres).max(axis=1).mean())
        if fit > best_fit:
            best, best_fit = centres, fit
    return best[np.argsort(best.prod(axis=1), kind="stable")].astype(np.float32)


def shape_iou(wh: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """``(n, k)`` IoU of boxes of sizes ``wh`` (n, 2) and ``anchors`` (k, 2) sharing their top-left corner."""
    inter = np.minimum(wh[:, None, 0], anchors[None, :, 0]) * np.minimum(wh[:, None, 1], anchors[None, :, 1])
    return inter / (wh.prod(axis=1)[:, None] + anchors.prod(axis=1)[None, :] - inter)


def _seed_centres(wh: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++: each next centre drawn with probability proportional to its squared distance to the nearest."""
    centres = [wh[rng.integers(len(wh))]]
    for _ in range(1, k):
        distance = (1.0 - shape_iou(wh, np.array(centres)).max(axis=1)) ** 2
        total = distance.sum()
        centres.append(wh[rng.choice(len(wh), p=distance / total)] if total > 0 else wh[rng.integers(len(wh))])
    return np.array(centres)


def _lloyd(wh: np.ndarray, centres: np.ndarray, iterations: int) -> np.ndarray:
    """Assign every box to its nearest centre and move each centre to its boxes' mean, until nothing changes."""
    assignment = None
    for _ in range(iterations):
        nearest = shape_iou(wh, centres).argmax(axis=1)
        if assignment is not None and np.array_equal(nearest, assignment):
            break
        assignment = nearest
        centres = np.array([wh[nearest == j].mean(axis=0) if (nearest == j).any() else centres[j]
                            for j in range(len(centres))])
    return centres
