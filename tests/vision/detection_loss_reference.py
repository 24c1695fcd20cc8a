"""Independent references of the detection loss's tests: YOLOv5's assignment box by box, CIoU from the corners,
the loss from them with alpha and the objectness target optionally frozen, and random batches."""

from __future__ import annotations

import math

import numpy as np

from neuroflow_ops_vision.detection.ciou import EPS

ANCHORS = np.array([[10.0, 13.0], [16.0, 30.0], [33.0, 23.0]])
STRIDE = 8


def reference_ciou(pred, target, alpha=None):
    """YOLOv5's CIoU written from the corners, as its bbox_iou does; ``alpha`` frozen when given."""
    p1, p2 = pred[:, :2] - pred[:, 2:] / 2, pred[:, :2] + pred[:, 2:] / 2
    t1, t2 = target[:, :2] - target[:, 2:] / 2, target[:, :2] + target[:, 2:] / 2
    inter = np.prod(np.clip(np.minimum(p2, t2) - np.maximum(p1, t1), 0, None), axis=1)
    union = np.prod(pred[:, 2:], axis=1) + np.prod(target[:, 2:], axis=1) - inter + EPS
    iou = inter / union
    hull = np.maximum(p2, t2) - np.minimum(p1, t1)
    c2 = (hull**2).sum(axis=1) + EPS
    rho2 = (((t1 + t2) - (p1 + p2)) ** 2).sum(axis=1) / 4
    v = 4 / math.pi**2 * (np.arctan(target[:, 2] / target[:, 3]) - np.arctan(pred[:, 2] / pred[:, 3])) ** 2
    if alpha is None:
        alpha = v / (v - iou + 1 + EPS)
    return iou - (rho2 / c2 + v * alpha), alpha


def reference_assignment(targets, anchors, stride, height, width, anchor_t=4.0):
    """One box at a time: a list of (image, anchor, row, col, label, x, y, w, h, anchor_w, anchor_h) in
    YOLOv5's order (offset, anchor, box); a neighbour is the cell holding the point half a cell from the centre."""
    entries = []
    boxes = [(b, row) for b in range(len(targets)) for row in targets[b] if row[0] != -1]
    for k, (b, (label, x1, y1, x2, y2)) in enumerate(boxes):
        cx, cy, w, h = (x1 + x2) / 2 / stride, (y1 + y2) / 2 / stride, (x2 - x1) / stride, (y2 - y1) / stride
        for a, (aw, ah) in enumerate(np.asarray(anchors) / stride):
            if max(w / aw, aw / w, h / ah, ah / h) >= anchor_t:
                continue
            gx, gy = math.floor(cx), math.floor(cy)
            cells = [(0, gx, gy)]
            if cx % 1 < 0.5 and cx > 1:
                cells.append((1, gx - 1, gy))
            if cy % 1 < 0.5 and cy > 1:
                cells.append((2, gx, gy - 1))
            if (width - cx) % 1 < 0.5 and width - cx > 1:
                cells.append((3, math.floor(cx + 0.5), gy))  # the own cell again for a centre on a cell edge
            if (height - cy) % 1 < 0.5 and height - cy > 1:
                cells.append((4, gx, math.floor(cy + 0.5)))
            for offset, col, row in cells:
                entries.append(((offset, a, k), (b, a, row, col, int(label), cx - col, cy - row, w, h, aw, ah)))
    return [entry for _, entry in sorted(entries, key=lambda e: e[0])]


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def bce(logits, wanted):
    return np.maximum(logits, 0) - logits * wanted + np.log1p(np.exp(-np.abs(logits)))


def reference_loss(pred, targets, num_classes, gains=(0.05, 1.0, 0.5), frozen=None, smoothing=0.0, factor=1.0):
    """The loss from the per-box assignment and corner CIoU; ``frozen`` = (alpha, objectness target) holds them.
    Returns (value, (alpha, objectness target))."""
    batch, _, height, width = pred.shape
    raw = pred.reshape(batch, len(ANCHORS), 5 + num_classes, height, width)
    entries = reference_assignment(targets, ANCHORS, STRIDE, height, width)
    tobj = np.zeros((batch, len(ANCHORS), height, width))
    l_box = l_cls = 0.0
    alpha = None
    if entries:
        e = np.array(entries, dtype=np.float64)
        b, a, row, col, label = (e[:, i].astype(int) for i in range(5))
        picked = raw[b, a, :, row, col]
        s = sigmoid(picked[:, :4])
        decoded = np.column_stack([2 * s[:, :2] - 0.5, (2 * s[:, 2:]) ** 2 * e[:, 9:11]])
        overlap, alpha = reference_ciou(decoded, e[:, 5:9], None if frozen is None else frozen[0])
        l_box = float(np.mean(1 - overlap))
        for i in range(len(e)):  # later entries overwrite earlier ones, as YOLOv5's tobj[b, a, gj, gi] = iou
            tobj[b[i], a[i], row[i], col[i]] = max(overlap[i], 0.0)
        if num_classes > 1:
            wanted = np.eye(num_classes)[label] * (1 - smoothing) + smoothing / 2
            l_cls = float(bce(picked[:, 5:], wanted).mean())
    if frozen is not None:
        tobj = frozen[1]
    l_obj = float(bce(raw[:, :, 4], tobj).mean())
    return factor * (gains[0] * l_box + gains[1] * l_obj + gains[2] * l_cls), (alpha, tobj)


def numeric_gradient(fn, x, picks, eps=1e-6):
    flat, grad = x.reshape(-1), np.zeros(x.size)
    for i in picks:
        old = flat[i]
        flat[i] = old + eps
        plus = fn(x)
        flat[i] = old - eps
        minus = fn(x)
        flat[i] = old
        grad[i] = (plus - minus) / (2 * eps)
    return grad


def random_targets(rng, batch, max_objects, num_classes, size, empty_images=()):
    targets = np.zeros((batch, max_objects, 5))
    targets[:, :, 0] = -1
    for b in range(batch):
        if b in empty_images:
            continue
        for m in range(rng.integers(1, max_objects + 1)):
            wh = rng.uniform(6, min(40, size - 1), 2)
            x1 = rng.uniform(0, size - wh)
            targets[b, m] = [rng.integers(0, num_classes), x1[0], x1[1], x1[0] + wh[0], x1[1] + wh[1]]
    return targets


def random_output(rng, batch, num_classes, height, width):
    return rng.standard_normal((batch, len(ANCHORS) * (5 + num_classes), height, width))
