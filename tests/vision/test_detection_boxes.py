"""Box decoding (YOLOv5's rule), pairwise IoU and the box-format conversions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow_ops_vision.detection.boxes import (
    box_area,
    box_iou,
    cxcywh_to_xyxy,
    decode,
    sigmoid,
    xywh_to_xyxy,
    xyxy_to_cxcywh,
    xyxy_to_xywh,
)

ANCHORS = np.array([[10.0, 14.0], [23.0, 27.0], [37.0, 58.0]], dtype=np.float32)
STRIDE = 8


def logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1.0 - p))


def encode(box: np.ndarray, anchor: np.ndarray, cell: tuple[int, int], stride: int) -> np.ndarray:
    """The raw (tx, ty, tw, th) that decode maps to ``box`` (xyxy) at ``cell`` (gy, gx): decode's inverse."""
    gy, gx = cell
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    w, h = box[2] - box[0], box[3] - box[1]
    return np.array([
        logit((cx / stride - gx + 0.5) / 2), logit((cy / stride - gy + 0.5) / 2),
        logit(np.sqrt(w / anchor[0]) / 2), logit(np.sqrt(h / anchor[1]) / 2),
    ])


def head(batch: int, classes: int, size: int, rng: np.random.Generator, dtype: type = np.float64) -> np.ndarray:
    return rng.normal(0.0, 1.5, (batch, 3 * (5 + classes), size, size)).astype(dtype)


def test_zero_logits_decode_to_cell_centres_and_anchor_sizes() -> None:
    output = np.zeros((1, 3 * 7, 2, 3), dtype=np.float32)
    decoded = decode(output, ANCHORS, STRIDE)
    assert decoded.shape == (1, 3 * 2 * 3, 7)
    assert decoded.dtype == np.float32
    for a in range(3):
        for gy in range(2):
            for gx in range(3):
                row = decoded[0, a * 6 + gy * 3 + gx]
                cx, cy = (gx + 0.5) * STRIDE, (gy + 0.5) * STRIDE
                w, h = ANCHORS[a]
                np.testing.assert_allclose(row[:4], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], rtol=1e-6)
                np.testing.assert_allclose(row[4:], 0.5)


def test_decode_known_values_and_channel_layout() -> None:
    classes = 2
    output = np.zeros((1, 3 * (5 + classes), 4, 4))
    # anchor 1, cell (gy=2, gx=3): tx = ty = large -> sigmoid 1 -> offset 1.5; tw = th = 0 -> anchor size
    base = 1 * (5 + classes)
    output[0, base + 0, 2, 3] = 40.0
    output[0, base + 1, 2, 3] = -40.0  # sigmoid 0 -> offset -0.5
    output[0, base + 4, 2, 3] = 2.0
    output[0, base + 6, 2, 3] = -1.0
    row = decode(output, ANCHORS, STRIDE)[0, 1 * 16 + 2 * 4 + 3]
    cx, cy = (1.5 + 3) * STRIDE, (-0.5 + 2) * STRIDE
    w, h = ANCHORS[1]
    np.testing.assert_allclose(row[:4], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], rtol=1e-12)
    np.testing.assert_allclose(row[4:], [1 / (1 + np.exp(-2.0)), 0.5, 1 / (1 + np.exp(1.0))], rtol=1e-12)


def test_decode_inverts_the_encoding(rng: np.random.Generator) -> None:
    size, classes = 5, 3
    output = np.zeros((2, 3 * (5 + classes), size, size))
    expected = {}
    for b in range(2):
        for a in range(3):
            gy, gx = (int(v) for v in rng.integers(0, size, 2))
            cx, cy = (gx + rng.uniform(-0.4, 1.4)) * STRIDE, (gy + rng.uniform(-0.4, 1.4)) * STRIDE
            w, h = ANCHORS[a] * rng.uniform(0.3, 3.5, 2)
            box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
            output[b, a * (5 + classes):a * (5 + classes) + 4, gy, gx] = encode(box, ANCHORS[a], (gy, gx), STRIDE)
            expected[b, a * size * size + gy * size + gx] = box
    decoded = decode(output, ANCHORS, STRIDE)
    for (b, row), box in expected.items():
        np.testing.assert_allclose(decoded[b, row, :4], box, rtol=1e-9, atol=1e-9)


def test_decode_float32_matches_float64(rng: np.random.Generator) -> None:
    output = head(2, 4, 6, rng)
    wide = decode(output, ANCHORS, STRIDE)
    narrow = decode(output.astype(np.float32), ANCHORS, STRIDE)
    assert narrow.dtype == np.float32 and wide.dtype == np.float64
    np.testing.assert_allclose(narrow, wide, rtol=1e-5, atol=1e-4)


def test_decode_runs_on_every_backend(nf_backend: Any, rng: np.random.Generator) -> None:
    output = head(2, 3, 4, rng, np.float32)
    decoded = decode(nf_backend.from_host(output), ANCHORS, STRIDE)
    np.testing.assert_allclose(nf_backend.to_host(decoded), decode(output, ANCHORS, STRIDE), rtol=1e-5, atol=1e-4)


def test_decode_large_logits_stay_finite() -> None:
    output = np.full((1, 3 * 6, 2, 2), -500.0, dtype=np.float32)
    output[:, ::2] = 500.0
    with np.errstate(all="raise"):
        decoded = decode(output, ANCHORS, STRIDE)
    assert np.isfinite(decoded).all()
    np.testing.assert_array_equal(sigmoid(np.array([-1e4, 0.0, 1e4], dtype=np.float32)), [0.0, 0.5, 1.0])


@pytest.mark.parametrize(("shape", "anchors", "stride", "match"), [
    ((1, 21, 4), ANCHORS, 8, "expected \\(B, A\\*\\(5\\+C\\), H, W\\)"),
    ((1, 20, 4, 4), ANCHORS, 8, "20 channels for 3 anchors"),
    ((1, 15, 4, 4), ANCHORS, 8, "C >= 1"),
    ((1, 21, 4, 4), ANCHORS[:, :1], 8, "expected \\(A, 2\\)"),
    ((1, 21, 4, 4), ANCHORS, 0, "stride 0"),
    ((1, 21, 4, 4), ANCHORS, 8.5, "stride 8.5"),
])
def test_decode_refuses_bad_shapes(shape: tuple[int, ...], anchors: np.ndarray, stride: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode(np.zeros(shape), anchors, stride)


def test_decode_checks_the_class_count_it_is_given() -> None:
    output = np.zeros((1, 45, 6, 6))
    assert decode(output, np.ones((5, 2)), 8).shape == (1, 180, 9)  # 5 anchors × 4 classes fits 45 channels too
    assert decode(output, np.ones((3, 2)), 8, num_classes=10).shape == (1, 108, 15)
    with pytest.raises(ShapeError, match=r"decode got 45 channels; expected 75 = 5 anchors × \(5 \+ 10 classes\)"):
        decode(output, np.ones((5, 2)), 8, num_classes=10)
    with pytest.raises(ValueError, match="decode got num_classes 0; expected a positive integer"):
        decode(output, np.ones((3, 2)), 8, num_classes=0)


def test_box_iou_known_values() -> None:
    a = np.array([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 0.0, 0.0]])
    b = np.array([[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0], [2.0, 2.0, 4.0, 4.0]])
    iou = box_iou(a, b)
    np.testing.assert_allclose(iou, [[1.0, 50 / 150, 0.0, 4 / 100], [0.0, 0.0, 0.0, 0.0]])
    assert box_iou(np.zeros((0, 4)), b).shape == (0, 4)
    np.testing.assert_allclose(box_iou(b, b), box_iou(b, b).T)


def test_box_iou_matches_a_loop(rng: np.random.Generator) -> None:
    a = np.sort(rng.uniform(0, 50, (7, 2, 2)), axis=1).transpose(0, 2, 1).reshape(7, 4)[:, [0, 2, 1, 3]]
    b = np.sort(rng.uniform(0, 50, (5, 2, 2)), axis=1).transpose(0, 2, 1).reshape(5, 4)[:, [0, 2, 1, 3]]
    expected = np.zeros((7, 5))
    for i, p in enumerate(a):
        for j, q in enumerate(b):
            inter = max(0.0, min(p[2], q[2]) - max(p[0], q[0])) * max(0.0, min(p[3], q[3]) - max(p[1], q[1]))
            expected[i, j] = inter / ((p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter)
    np.testing.assert_allclose(box_iou(a, b), expected, rtol=1e-12)


def test_conversions_round_trip(rng: np.random.Generator) -> None:
    corners = rng.uniform(0, 10, (6, 4))
    corners[:, 2:] += corners[:, :2]
    np.testing.assert_allclose(xyxy_to_xywh(corners)[:, 2:], corners[:, 2:] - corners[:, :2])
    np.testing.assert_allclose(xywh_to_xyxy(xyxy_to_xywh(corners)), corners, rtol=1e-12)
    np.testing.assert_allclose(cxcywh_to_xyxy(xyxy_to_cxcywh(corners)), corners, rtol=1e-12)
    np.testing.assert_allclose(xyxy_to_cxcywh(np.array([0.0, 2.0, 4.0, 10.0])), [2.0, 6.0, 4.0, 8.0])
    np.testing.assert_allclose(box_area(np.array([[0.0, 0.0, 2.0, 3.0], [5.0, 5.0, 4.0, 9.0]])), [6.0, 0.0])


def test_conversions_refuse_a_wrong_last_axis() -> None:
    with pytest.raises(ShapeError, match="expected \\(..., 4\\)"):
        xyxy_to_xywh(np.zeros((3, 5)))
    with pytest.raises(ShapeError, match="\\(N, 4\\) and \\(M, 4\\)"):
        box_iou(np.zeros(4), np.zeros((2, 4)))
