"""Per-class greedy NMS against a plain-Python reference; thresholds, max_det, empty inputs, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow_ops_vision.detection.nms import batched_nms, non_max_suppression


def reference_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float,
                  max_det: int | None = None) -> list[int]:
    """Greedy NMS as written in textbooks: one box at a time, per class, stable on equal scores."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))  # sorted() is stable
    kept: list[int] = []
    for i in order:
        if max_det is not None and len(kept) == max_det:
            break
        suppressed = False
        for j in kept:
            if classes[j] != classes[i]:
                continue
            a, b = boxes[i].astype(float), boxes[j].astype(float)
            w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
            h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
            union = max(a[2] - a[0], 0) * max(a[3] - a[1], 0) + max(b[2] - b[0], 0) * max(b[3] - b[1], 0) - w * h
            if union > 0 and w * h / union > iou:
                suppressed = True
                break
        if not suppressed:
            kept.append(i)
    return kept


def random_boxes(rng: np.random.Generator, n: int, spread: float = 60.0) -> np.ndarray:
    corner = rng.uniform(0, spread, (n, 2))
    return np.concatenate([corner, corner + rng.uniform(2, 30, (n, 2))], axis=1)


@pytest.mark.parametrize("seed", range(12))
def test_batched_nms_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    boxes = random_boxes(rng, n, spread=float(rng.choice([10.0, 60.0])))
    scores = rng.random(n)
    if seed % 2:
        scores = np.round(scores, 1)  # many ties: equal scores keep their candidate order
    classes = rng.integers(0, 3, n)
    iou = float(rng.choice([0.3, 0.5, 0.6, 0.9]))
    max_det = None if seed % 3 else int(rng.integers(1, 20))
    np.testing.assert_array_equal(batched_nms(boxes, scores, classes, iou, max_det),
                                  reference_nms(boxes, scores, classes, iou, max_det))


def test_equal_scores_keep_the_earlier_candidate() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [1, 1, 11, 11]], dtype=np.float32)
    np.testing.assert_array_equal(batched_nms(boxes, np.array([0.5, 0.5, 0.5]), np.zeros(3), 0.6), [0])


def test_boxes_of_different_classes_never_suppress_each_other() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], dtype=np.float32)
    kept = batched_nms(boxes, np.array([0.9, 0.8, 0.7]), np.array([0, 1, 0]), 0.6)
    np.testing.assert_array_equal(kept, [0, 1])


def test_the_iou_threshold_is_strict() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 5]], dtype=np.float64)  # IoU exactly 0.5
    np.testing.assert_array_equal(batched_nms(boxes, np.array([0.9, 0.8]), np.zeros(2), 0.5), [0, 1])
    np.testing.assert_array_equal(batched_nms(boxes, np.array([0.9, 0.8]), np.zeros(2), 0.49), [0])


def test_empty_and_degenerate_candidates() -> None:
    assert batched_nms(np.zeros((0, 4)), np.zeros(0), np.zeros(0), 0.6).shape == (0,)
    # zero-area boxes have no overlap with anything: all kept
    flat = np.array([[5, 5, 5, 5], [5, 5, 5, 5]], dtype=np.float32)
    np.testing.assert_array_equal(batched_nms(flat, np.array([0.3, 0.2]), np.zeros(2), 0.6), [0, 1])


def decoded_rows(boxes: np.ndarray, objectness: np.ndarray, class_probs: np.ndarray) -> np.ndarray:
    return np.concatenate([boxes, objectness[:, None], class_probs], axis=1)[None].astype(np.float32)


def test_non_max_suppression_output_layout_and_order() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [40, 40, 60, 60]], dtype=np.float32)
    rows = decoded_rows(boxes, np.array([0.9, 0.8, 0.5]), np.array([[0.9, 0.1], [0.9, 0.2], [0.1, 0.8]]))
    (found,) = non_max_suppression(rows, conf=0.05, multi_label=False)
    assert found.dtype == np.float32 and found.shape == (2, 6)
    np.testing.assert_allclose(found[:, :4], boxes[[0, 2]])
    np.testing.assert_allclose(found[:, 4], [0.81, 0.4], rtol=1e-6)
    np.testing.assert_array_equal(found[:, 5], [0, 1])


def test_multi_label_makes_a_box_a_candidate_for_every_class_above_conf() -> None:
    rows = decoded_rows(np.array([[0, 0, 10, 10]], np.float32), np.array([0.5]), np.array([[0.9, 0.4, 0.001]]))
    (multi,) = non_max_suppression(rows, conf=0.1)
    np.testing.assert_allclose(multi[:, 4:], [[0.45, 0], [0.2, 1]], rtol=1e-6)
    (single,) = non_max_suppression(rows, conf=0.1, multi_label=False)
    np.testing.assert_allclose(single[:, 4:], [[0.45, 0]], rtol=1e-6)


def test_conf_threshold_drops_low_scores_strictly() -> None:
    rows = decoded_rows(random_boxes(np.random.default_rng(1), 3, 200.0).astype(np.float32),
                        np.array([1.0, 1.0, 1.0]), np.array([[0.25], [0.5], [0.75]]))
    (found,) = non_max_suppression(rows, conf=0.5)
    np.testing.assert_allclose(found[:, 4], [0.75])
    (none,) = non_max_suppression(rows, conf=0.9)
    assert none.shape == (0, 6) and none.dtype == np.float32


def test_max_det_keeps_the_best(rng: np.random.Generator) -> None:
    boxes = np.array([[i * 20, 0, i * 20 + 10, 10] for i in range(50)], dtype=np.float32)  # no overlaps
    scores = rng.random(50)
    rows = decoded_rows(boxes, scores, np.ones((50, 1)))
    (found,) = non_max_suppression(rows, max_det=7)
    np.testing.assert_allclose(found[:, 4], np.sort(scores.astype(np.float32))[::-1][:7])


def test_non_max_suppression_matches_the_reference_per_image(rng: np.random.Generator) -> None:
    batch, n, classes = 3, 60, 4
    rows = np.concatenate([np.stack([random_boxes(rng, n, 30.0) for _ in range(batch)]),
                           rng.random((batch, n, 1 + classes))], axis=2).astype(np.float32)
    for image, found in zip(rows, non_max_suppression(rows, conf=0.2, iou=0.5), strict=True):
        scores = image[:, 4:5] * image[:, 5:]
        box_index, label = np.nonzero(scores > 0.2)
        kept = reference_nms(image[box_index, :4], scores[box_index, label], label, 0.5, 300)
        np.testing.assert_array_equal(found[:, :4], image[box_index[kept], :4])
        np.testing.assert_array_equal(found[:, 5], label[kept])
    empty = non_max_suppression(np.zeros((2, 0, 6), np.float32))
    assert [e.shape for e in empty] == [(0, 6), (0, 6)]


def test_matches_torchvision_batched_nms(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    boxes = random_boxes(rng, 300, 40.0)
    scores = rng.random(300)  # distinct scores: torchvision's order on ties is unspecified
    classes = rng.integers(0, 5, 300)
    expected = ops.batched_nms(torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(classes), 0.6)
    np.testing.assert_array_equal(batched_nms(boxes, scores, classes, 0.6), expected.numpy())


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"conf": 1.0}, "conf=1.0"), ({"conf": -0.1}, "conf=-0.1"), ({"iou": 1.5}, "iou=1.5"),
    ({"max_det": 0}, "max_det=0"), ({"max_det": 2.5}, "max_det=2.5"),
])
def test_non_max_suppression_refuses_bad_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        non_max_suppression(np.zeros((1, 4, 7), np.float32), **kwargs)  # type: ignore[arg-type]


def test_non_max_suppression_refuses_bad_shapes() -> None:
    with pytest.raises(ShapeError, match="expected \\(B, N, 5\\+C\\)"):
        non_max_suppression(np.zeros((4, 7), np.float32))
    with pytest.raises(ShapeError, match="expected \\(B, N, 5\\+C\\) with C >= 1"):
        non_max_suppression(np.zeros((1, 4, 5), np.float32))
    with pytest.raises(ShapeError, match="expected \\(3,\\) each"):
        batched_nms(np.zeros((3, 4)), np.zeros(2), np.zeros(3))


def test_agnostic_nms_lets_boxes_of_any_class_suppress_each_other() -> None:
    # one object scored as two classes (what a picture would show as two boxes): agnostic keeps one box
    boxes = np.array([[48, 69, 64, 90], [47.8, 69.9, 63, 89], [0, 0, 10, 10]], dtype=np.float32)
    rows = decoded_rows(boxes, np.array([0.9, 0.9, 0.8]), np.array([[0.47, 0.1], [0.1, 0.46], [0.1, 0.9]]))
    (per_class,) = non_max_suppression(rows, conf=0.25, multi_label=False)
    (agnostic,) = non_max_suppression(rows, conf=0.25, multi_label=False, agnostic=True)
    assert len(per_class) == 3
    np.testing.assert_allclose(agnostic[:, :4], boxes[[2, 0]])
    np.testing.assert_array_equal(agnostic[:, 5], [1, 0])  # each kept box keeps its own class


def test_agnostic_nms_equals_per_class_nms_of_one_class(rng: np.random.Generator) -> None:
    boxes = random_boxes(rng, 80, spread=30.0).astype(np.float32)
    rows = decoded_rows(boxes, rng.random(80), rng.random((80, 4)))
    (agnostic,) = non_max_suppression(rows, conf=0.01, iou=0.45, agnostic=True, multi_label=False)
    class_scores = rows[0, :, 4:5] * rows[0, :, 5:]
    scores, classes = class_scores.max(axis=1), class_scores.argmax(axis=1)
    keep = [i for i in reference_nms(boxes, scores, np.zeros(80), 0.45) if scores[i] > 0.01]
    np.testing.assert_allclose(agnostic[:, :4], boxes[keep])
    np.testing.assert_array_equal(agnostic[:, 5], classes[keep])
