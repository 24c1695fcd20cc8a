"""Complete IoU (CIoU) of box pairs and its analytic gradient with respect to the first box.

CIoU (Zheng et al., 2020, in YOLOv5's form) of a predicted box p and a
target box t, both (cx, cy, w, h)::

    ciou = iou - rho² / c² - alpha · v
    v = 4/π² · (atan(w_t / h_t) - atan(w_p / h_p))²
    alpha = v / (v - iou + 1 + eps)

with rho the distance between the centres, c the diagonal of the smallest
box enclosing both, and ``eps`` added to the union and to c² as YOLOv5 does.
``alpha`` is a weight, not differentiated (YOLOv5 computes it under
``no_grad``), so the gradient of the aspect term is ``alpha · dv``. Where a
``min``/``max`` ties (edges that coincide) the gradient takes the target's
side: the prediction's edge gets none of it. Every function takes float
arrays of shape (..., 4) on the host and computes in their dtype.
"""

from __future__ import annotations

import math

import numpy as np

#: YOLOv5's guard against a zero union or enclosing diagonal.
EPS = 1e-7
_ASPECT = 4.0 / math.pi**2


def ciou(pred: np.ndarray, target: np.ndarray, eps: float = EPS) -> np.ndarray:
    """CIoU of each pair of (cx, cy, w, h) boxes: shape (...,); 1 for identical boxes, > -1 always."""
    return _Pair(pred, target, eps).value


def ciou_with_grad(pred: np.ndarray, target: np.ndarray, eps: float = EPS) -> tuple[np.ndarray, np.ndarray]:
    """CIoU of each pair and d CIoU / d ``pred`` (shape (..., 4): cx, cy, w, h), alpha held constant.

    ``pred``'s widths and heights must be positive (a decoded prediction's always are).
    """
    pair = _Pair(pred, target, eps)
    return pair.value, pair.gradient()


class _Pair:
    """The terms of CIoU for box pairs, kept for the gradient."""

    def __init__(self, pred: np.ndarray, target: np.ndarray, eps: float) -> None:
        px, py, pw, ph = pred[..., 0], pred[..., 1], pred[..., 2], pred[..., 3]
        tx, ty, tw, th = target[..., 0], target[..., 1], target[..., 2], target[..., 3]
        self.pred_wh = pw, ph
        self.pred_edges = px - pw / 2, px + pw / 2, py - ph / 2, py + ph / 2
        self.target_edges = tx - tw / 2, tx + tw / 2, ty - th / 2, ty + th / 2
        (p_left, p_right, p_top, p_bottom), (t_left, t_right, t_top, t_bottom) = self.pred_edges, self.target_edges

        inter_w = np.minimum(p_right, t_right) - np.maximum(p_left, t_left)
        inter_h = np.minimum(p_bottom, t_bottom) - np.maximum(p_top, t_top)
        self.overlap = inter_w > 0, inter_h > 0
        self.inter_wh = np.where(self.overlap[0], inter_w, 0.0), np.where(self.overlap[1], inter_h, 0.0)
        inter = self.inter_wh[0] * self.inter_wh[1]
        self.union = pw * ph + tw * th - inter + eps
        self.iou = inter / self.union

        self.hull_wh = (np.maximum(p_right, t_right) - np.minimum(p_left, t_left),
                        np.maximum(p_bottom, t_bottom) - np.minimum(p_top, t_top))
        self.diagonal = self.hull_wh[0] ** 2 + self.hull_wh[1] ** 2 + eps
        self.centre_gap = px - tx, py - ty
        self.distance = (self.centre_gap[0] ** 2 + self.centre_gap[1] ** 2) / self.diagonal

        self.angle = np.arctan(tw / th) - np.arctan(pw / ph)
        v = _ASPECT * self.angle**2
        self.alpha = v / (v - self.iou + (1.0 + eps))
        self.value = self.iou - (self.distance + self.alpha * v)

    def gradient(self) -> np.ndarray:
        """d CIoU / d (cx, cy, w, h) of the prediction, alpha constant."""
        (p_left, p_right, p_top, p_bottom), (t_left, t_right, t_top, t_bottom) = self.pred_edges, self.target_edges
        (overlap_x, overlap_y), (inter_w, inter_h) = self.overlap, self.inter_wh
        pw, ph = self.pred_wh
        zeros = np.zeros_like(pw)
        iou = self.iou

        # IoU = I / U with U = A_p + A_t - I + eps: dIoU = ((1 + IoU) dI - IoU dA_p) / U
        d_inter = _edges_to_box(-np.where(overlap_x & (p_left > t_left), inter_h, 0.0),
                                np.where(overlap_x & (p_right < t_right), inter_h, 0.0),
                                -np.where(overlap_y & (p_top > t_top), inter_w, 0.0),
                                np.where(overlap_y & (p_bottom < t_bottom), inter_w, 0.0))
        d_area = np.stack([zeros, zeros, ph, pw], axis=-1)
        d_iou = ((1.0 + iou)[..., None] * d_inter - iou[..., None] * d_area) / self.union[..., None]

        # rho² / c²: d = (d rho² - (rho² / c²) d c²) / c²
        twice_w, twice_h = 2.0 * self.hull_wh[0], 2.0 * self.hull_wh[1]
        d_diagonal = _edges_to_box(-np.where(p_left < t_left, twice_w, 0.0), np.where(p_right > t_right, twice_w, 0.0),
                                   -np.where(p_top < t_top, twice_h, 0.0), np.where(p_bottom > t_bottom, twice_h, 0.0))
        d_rho = np.stack([2.0 * self.centre_gap[0], 2.0 * self.centre_gap[1], zeros, zeros], axis=-1)
        d_distance = (d_rho - self.distance[..., None] * d_diagonal) / self.diagonal[..., None]

        # alpha · v: d atan(w / h) = (h dw - w dh) / (w² + h²)
        slope = (-2.0 * _ASPECT) * self.alpha * self.angle / (pw**2 + ph**2)
        d_aspect = np.stack([zeros, zeros, slope * ph, -slope * pw], axis=-1)
        return d_iou - d_distance - d_aspect


def _edges_to_box(d_left: np.ndarray, d_right: np.ndarray, d_top: np.ndarray, d_bottom: np.ndarray) -> np.ndarray:
    """Gradients with respect to the edges -> with respect to (cx, cy, w, h): left = cx - w/2, right = cx + w/2."""
    return np.stack([d_left + d_right, d_top + d_bottom, (d_right - d_left) / 2, (d_bottom - d_top) / 2], axis=-1)
