"""Boxes: decoding the detector's raw head (YOLOv5's rule), pairwise IoU and box formats.

Formats: ``xyxy`` is (x1, y1, x2, y2), ``xywh`` is COCO's (x, y, width, height)
with (x, y) the top-left corner, ``cxcywh`` is (centre x, centre y, width,
height). All are pixels, x to the right, y down; the last axis holds the four
numbers. The functions work on numpy arrays and on any backend's arrays
(``neuroflow.backends.namespaces.array_namespace`` picks the namespace).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ShapeError


def _check_boxes(boxes: Any, name: str) -> None:
    if boxes.ndim < 1 or boxes.shape[-1] != 4:
        raise ShapeError(f"{name} got boxes of shape {tuple(boxes.shape)}; expected (..., 4)")


def _split(boxes: Any) -> tuple[Any, Any, Any, Any]:
    return boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]


def xyxy_to_xywh(boxes: Any) -> Any:
    """(x1, y1, x2, y2) -> COCO's (x, y, w, h)."""
    _check_boxes(boxes, "xyxy_to_xywh")
    x1, y1, x2, y2 = _split(boxes)
    return array_namespace(boxes).stack([x1, y1, x2 - x1, y2 - y1], axis=-1)


def xywh_to_xyxy(boxes: Any) -> Any:
    """COCO's (x, y, w, h) -> (x1, y1, x2, y2)."""
    _check_boxes(boxes, "xywh_to_xyxy")
    x, y, w, h = _split(boxes)
    return array_namespace(boxes).stack([x, y, x + w, y + h], axis=-1)


def xyxy_to_cxcywh(boxes: Any) -> Any:
    """(x1, y1, x2, y2) -> (cx, cy, w, h)."""
    _check_boxes(boxes, "xyxy_to_cxcywh")
    x1, y1, x2, y2 = _split(boxes)
    return array_namespace(boxes).stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=-1)


def cxcywh_to_xyxy(boxes: Any) -> Any:
    """(cx, cy, w, h) -> (x1, y1, x2, y2)."""
    _check_boxes(boxes, "cxcywh_to_xyxy")
    cx, cy, w, h = _split(boxes)
    return array_namespace(boxes).stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def box_area(boxes: Any) -> Any:
    """Areas of (..., 4) xyxy boxes (0 for degenerate boxes)."""
    _check_boxes(boxes, "box_area")
    xp = array_namespace(boxes)
    x1, y1, x2, y2 = _split(boxes)
    return xp.maximum(x2 - x1, 0) * xp.maximum(y2 - y1, 0)


def box_iou(a: Any, b: Any) -> Any:
    """Pairwise IoU of xyxy boxes: (N, 4) and (M, 4) -> (N, M); 0 where the union is empty."""
    _check_boxes(a, "box_iou")
    _check_boxes(b, "box_iou")
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"box_iou takes (N, 4) and (M, 4) boxes; got {tuple(a.shape)} and {tuple(b.shape)}")
    xp = array_namespace(a)
    width = xp.minimum(a[:, None, 2], b[None, :, 2]) - xp.maximum(a[:, None, 0], b[None, :, 0])
    height = xp.minimum(a[:, None, 3], b[None, :, 3]) - xp.maximum(a[:, None, 1], b[None, :, 1])
    inter = xp.maximum(width, 0) * xp.maximum(height, 0)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    # where the union is 0 the intersection is 0 too: 0 / 1 instead of 0 / 0
    return inter / xp.where(union > 0, union, xp.ones_like(union))


def sigmoid(x: Any) -> Any:
    """The logistic function written with tanh: no overflow for large negative logits in float32."""
    return 0.5 * (array_namespace(x).tanh(0.5 * x) + 1.0)


def decode(output: Any, anchors: Any, stride: int, num_classes: int | None = None) -> Any:
    """The raw head (B, A*(5+C), H, W) -> (B, A*H*W, 5+C): x1, y1, x2, y2, objectness, class probabilities.

    YOLOv5's decoding: ``cx = (2 sigmoid(tx) - 0.5 + gx) * stride`` (cy with
    gy), ``w = (2 sigmoid(tw))**2 * anchor_w`` (h with anchor_h), objectness
    and class probabilities are sigmoids of their logits. Channel
    ``a*(5+C) + j`` is number j of anchor a. Row ``a*H*W + gy*W + gx`` of the
    result is anchor a at cell (gy, gx), YOLOv5's order. The result has the
    output's array type and dtype. ``num_classes`` C, when the caller knows
    it, is checked against the channels; without it only A*(5+C) for some
    C >= 1 is (45 channels read as 3 anchors × 10 classes or as 5 × 4).

    Example::

        decoded = decode(model_output, model.anchors, model.stride, model.num_classes)
        detections = non_max_suppression(decoded)
    """
    xp = array_namespace(output)
    anchors_host = np.asarray(anchors, dtype=np.float64)
    if anchors_host.ndim != 2 or anchors_host.shape[1] != 2 or anchors_host.shape[0] == 0:
        raise ShapeError(f"decode got anchors of shape {anchors_host.shape}; expected (A, 2) (width, height) pixels")
    if output.ndim != 4:
        raise ShapeError(f"decode got an output of shape {tuple(output.shape)}; expected (B, A*(5+C), H, W)")
    if not isinstance(stride, (int, np.integer)) or stride <= 0:
        raise ValueError(f"decode got stride {stride!r}; expected a positive integer (pixels per cell)")
    batch, channels, height, width = (int(s) for s in output.shape)
    count = anchors_host.shape[0]
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ValueError(f"decode got num_classes {num_classes!r}; expected a positive integer")
        if channels != count * (5 + num_classes):
            raise ShapeError(
                f"decode got {channels} channels; expected {count * (5 + num_classes)} = {count} anchors × "
                f"(5 + {num_classes} classes): the output is not this detector's head (other anchors or classes)"
            )
    per_anchor = channels // count
    if channels % count or per_anchor < 6:
        raise ShapeError(
            f"decode got {channels} channels for {count} anchors; expected A*(5+C) = {count}*(5+C) with C >= 1"
        )
    # array methods and a few namespace functions only, so every backend's arrays decode (OpenCL's too)
    raw = output.reshape(batch, count, per_anchor, height, width)
    dtype = output.dtype
    grid_x = xp.asarray(np.arange(width).reshape(1, 1, 1, width), dtype=dtype)
    grid_y = xp.asarray(np.arange(height).reshape(1, 1, height, 1), dtype=dtype)
    anchor_w = xp.asarray(anchors_host[:, 0].reshape(1, count, 1, 1), dtype=dtype)
    anchor_h = xp.asarray(anchors_host[:, 1].reshape(1, count, 1, 1), dtype=dtype)
    centre_x = (2.0 * sigmoid(raw[:, :, 0]) - 0.5 + grid_x) * stride
    centre_y = (2.0 * sigmoid(raw[:, :, 1]) - 0.5 + grid_y) * stride
    box_w = (2.0 * sigmoid(raw[:, :, 2])) ** 2 * anchor_w
    box_h = (2.0 * sigmoid(raw[:, :, 3])) ** 2 * anchor_h
    corners = [centre_x - box_w / 2, centre_y - box_h / 2, centre_x + box_w / 2, centre_y + box_h / 2]
    planes = [corner.reshape(batch, count, 1, height, width) for corner in corners]
    decoded = xp.concatenate([*planes, sigmoid(raw[:, :, 4:])], axis=2)  # (B, A, 5+C, H, W)
    decoded = xp.ascontiguousarray(decoded.transpose(0, 1, 3, 4, 2))
    return decoded.reshape(batch, count * height * width, per_anchor)
