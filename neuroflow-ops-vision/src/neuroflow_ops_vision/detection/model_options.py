"""What a config may leave to the training data for yolo_lite: ``[model] anchors = "kmeans"``.

:func:`anchors_from_data` is yolo_lite's resolver (see
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


def anchors_from_data(options: dict[str, Any], train: Any) -> dict[str, Any]:
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
    _, targets = train[np.arange(len(train))]
    if targets is None or np.ndim(targets) != 3:
        raise ValueError(f"anchors = {KMEANS!r} needs training targets of boxes (B, M, 5); the training "
                         f"set has {'none' if targets is None else f'targets of shape {np.shape(targets)}'}")
    fitted = kmeans_anchors(np.asarray(targets), k=NUM_ANCHORS, seed=0)
    return {**options, "anchors": np.round(fitted.astype(np.float64), 2).tolist()}
