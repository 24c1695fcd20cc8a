"""What a config may leave to the training data for yolo_lite: ``[model] anchors = "kmeans"``.

:func:`yolo_lite_options` is yolo_lite's resolver (see
:mod:`neuroflow.config.from_data`): with ``anchors = "kmeans"`` the config
builds the model with :func:`~neuroflow_ops_vision.detection.anchors.kmeans_anchors`
of the training set's boxes (three anchors, seed 0), so the anchors fit the
data a config names without being copied into it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow_ops_vision.detection.anchors import kmeans_anchors

KMEANS = "kmeans"
NUM_ANCHORS = 3


def yolo_lite_options(options: dict[str, Any], train: Any) -> dict[str, Any]:
    """yolo_lite's resolver: ``anchors = "kmeans"`` fitted (:func:`anchors_from_data`), after checking that the
    model's ``num_classes`` covers the training boxes' class ids and the images' sides are multiples of 16 (a
    ValueError naming the values otherwise, before anything is built or trained)."""
    images, targets = _training_arrays(train)
    if targets is not None and np.ndim(targets) == 3 and np.size(targets):
        classes = int(options.get("num_classes", 10))
        highest = int(np.max(np.asarray(targets)[..., 0]))
        if highest >= classes:
            raise ValueError(f"num_classes = {classes}, but the training boxes have class ids up to {highest}; "
                             f"set num_classes = {highest + 1} (or more) to match the data")
    if images is not None and np.ndim(images) == 4 and any(side % 16 for side in np.shape(images)[2:]):
        shape = np.shape(images)[2:]
        raise ValueError(f"the training images are {shape[0]} x {shape[1]} px; yolo_lite takes sides that are "
                         "multiples of 16 (its stride-16 map is upsampled onto the stride-8 head): give the data "
                         "such a size (e.g. [data] size = 48 or 96)")
    return anchors_from_data(options, train, targets)


def _training_arrays(train: Any) -> tuple[Any, Any]:
    """The training set's images and padded targets, without copying them when it keeps them as attributes."""
    images, targets = getattr(train, "images", None), getattr(train, "targets", None)
    if images is None or targets is None:
        images, targets = train[np.arange(len(train))]
    return images, targets


def anchors_from_data(options: dict[str, Any], train: Any, targets: Any = None) -> dict[str, Any]:
    """``options`` with ``anchors = "kmeans"`` replaced by the k-means anchors of ``train``'s boxes.

    ``train`` is a Dataset whose targets are padded ``(B, M, 5)`` boxes (a
    DetectionDataset). Any other string for ``anchors`` raises ValueError.
    """
    anchors = options.get("anchors")
    if not isinstance(anchors, str):
        return options
    if anchors != KMEANS:
        raise ValueError(f"anchors must be three [w, h] pairs or {KMEANS!r} (k-means over the training "
                         f"boxes); got {anchors!r}")
    if targets is None:
        _, targets = _training_arrays(train)
    if targets is None or np.ndim(targets) != 3:
        raise ValueError(f"anchors = {KMEANS!r} needs training targets of boxes (B, M, 5); the training "
                         f"set has {'none' if targets is None else f'targets of shape {np.shape(targets)}'}")
    try:
        fitted = kmeans_anchors(np.asarray(targets), k=NUM_ANCHORS, seed=0)
    except ValueError as exc:
        raise ValueError(f"anchors = {KMEANS!r} over {len(targets)} training image(s): {exc}; train on more "
                         "images (e.g. [data] n_train) or give three [w, h] pairs") from exc
    return {**options, "anchors": np.round(fitted.astype(np.float64), 2).tolist()}
