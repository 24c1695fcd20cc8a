"""DetectionEvaluator: raw outputs and padded targets in, COCO's mAP@0.5 and COCO files out."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow_ops_vision.detection.boxes import decode
from neuroflow_ops_vision.detection.evaluation import DetectionEvaluator
from neuroflow_ops_vision.detection.metric import mean_average_precision

ANCHORS = np.array([[12.0, 12.0], [24.0, 24.0], [40.0, 40.0]], dtype=np.float32)
STRIDE, CELLS, CLASSES, MAX_OBJECTS = 8, 12, 3, 4


def logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))


def raw_output(targets: np.ndarray) -> np.ndarray:
    """A head output (B, A*(5+C), H, W) whose decoding is exactly each target box, with score ~1 for its class."""
    output = np.full((targets.shape[0], 3, 5 + CLASSES, CELLS, CELLS), -12.0)
    for b, image in enumerate(targets):
        for label, x1, y1, x2, y2 in image[image[:, 0] >= 0]:
            cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
            gx, gy = int(cx // STRIDE), int(cy // STRIDE)
            anchor = int(np.argmin(np.abs(np.log(ANCHORS[:, 0] / w))))
            aw, ah = ANCHORS[anchor]
            output[b, anchor, :4, gy, gx] = [logit((cx / STRIDE - gx + 0.5) / 2), logit((cy / STRIDE - gy + 0.5) / 2),
                                             logit(np.sqrt(w / aw) / 2), logit(np.sqrt(h / ah) / 2)]
            output[b, anchor, 4, gy, gx] = 12.0
            output[b, anchor, 5 + int(label), gy, gx] = 12.0
    return output.reshape(targets.shape[0], -1, CELLS, CELLS).astype(np.float32)


def padded_targets(rng: np.random.Generator, batch: int) -> np.ndarray:
    targets = np.zeros((batch, MAX_OBJECTS, 5), np.float32)
    targets[:, :, 0] = -1
    for b in range(batch):
        k = int(rng.integers(0, MAX_OBJECTS + 1))
        for row in range(k):  # one object per quadrant: no two share a cell
            qx, qy = (row % 2) * 48, (row // 2) * 48
            w, h = rng.uniform(14, 30, 2)
            x1, y1 = qx + rng.uniform(2, 44 - w), qy + rng.uniform(2, 44 - h)
            targets[b, row] = [rng.integers(0, CLASSES), x1, y1, x1 + w, y1 + h]
    return targets


def test_exact_outputs_score_one_and_padding_is_dropped(rng: np.random.Generator) -> None:
    evaluator = DetectionEvaluator(ANCHORS, STRIDE, CLASSES)
    batches = [padded_targets(rng, 5) for _ in range(3)]
    for targets in batches:
        evaluator.add(raw_output(targets), targets)
    assert evaluator.result() == {"mAP@0.5": pytest.approx(1.0)}
    assert len(evaluator.detections) == len(evaluator.ground_truth) == 15
    truth = np.concatenate(evaluator.ground_truth)
    assert (truth[:, 0] >= 0).all() and len(truth) == sum(int((t[:, :, 0] >= 0).sum()) for t in batches)
    best = [d[0] for d in evaluator.detections if len(d)]
    assert all(d[4] > 0.99 for d in best)
    assert evaluator.image_size == (96, 96)


def test_result_equals_the_metric_on_the_collected_lists(rng: np.random.Generator) -> None:
    evaluator = DetectionEvaluator(ANCHORS, STRIDE, CLASSES)
    targets = padded_targets(rng, 6)
    noisy = raw_output(targets) + rng.normal(0, 2.0, (6, 3 * (5 + CLASSES), CELLS, CELLS)).astype(np.float32)
    evaluator.add(noisy, targets)
    value = evaluator.result()["mAP@0.5"]
    assert 0.0 <= value < 1.0
    assert value == mean_average_precision(evaluator.detections, evaluator.ground_truth, num_classes=CLASSES)
    for found in evaluator.detections:  # clipped to the image, sorted by score
        assert (found[:, :4] >= 0).all() and (found[:, :4] <= 96).all()
        assert (np.diff(found[:, 4]) <= 0).all()
    evaluator.reset()
    assert evaluator.detections == [] and evaluator.result() == {"mAP@0.5": -1.0}


def test_written_coco_files_give_pycocotools_the_same_figure(tmp_path: Path, rng: np.random.Generator) -> None:
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    evaluator = DetectionEvaluator(ANCHORS, STRIDE, CLASSES)
    targets = padded_targets(rng, 8)
    evaluator.add(raw_output(targets) + rng.normal(0, 1.0, (8, 3 * (5 + CLASSES), CELLS, CELLS)), targets)
    truth_path, found_path = evaluator.write_coco_json(tmp_path / "out")
    assert truth_path == tmp_path / "out" / "ground_truth.json" and found_path.name == "detections.json"
    with contextlib.redirect_stdout(io.StringIO()):
        truth = coco.COCO(str(truth_path))
        evaluation = cocoeval.COCOeval(truth, truth.loadRes(str(found_path)), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert evaluation.stats[1] == pytest.approx(evaluator.result()["mAP@0.5"], abs=1e-4)


def test_objects_are_the_confident_boxes_of_decoded_predictions(rng: np.random.Generator) -> None:
    evaluator = DetectionEvaluator(ANCHORS, STRIDE, CLASSES)
    targets = padded_targets(rng, 3)
    found = [o[o[:, 4] >= 0.25] for o in evaluator.objects(decode(raw_output(targets), ANCHORS, STRIDE))]
    for image, objects in zip(targets, found, strict=True):
        truth = image[image[:, 0] >= 0]
        assert objects.shape == (len(truth), 6) and (objects[:, 4] > 0.99).all()
        order = np.lexsort((truth[:, 1], truth[:, 0]))
        mine = np.lexsort((objects[:, 0], objects[:, 5]))
        np.testing.assert_allclose(objects[mine, :4], truth[order, 1:], atol=1e-3)
        np.testing.assert_array_equal(objects[mine, 5], truth[order, 0])
    assert all(len(o) == 0 for o in evaluator.objects(decode(raw_output(targets), ANCHORS, STRIDE), conf=0.999995))


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="num_classes=0"):
        DetectionEvaluator(ANCHORS, STRIDE, 0)
    evaluator = DetectionEvaluator(ANCHORS, STRIDE, CLASSES)
    with pytest.raises(ValueError, match="nothing was added yet"):
        evaluator.write_coco_json("unused")
    targets = np.full((2, MAX_OBJECTS, 5), -1, np.float32)
    with pytest.raises(ShapeError, match="expected \\(B, 24, H, W\\) for 3 anchors and 3 classes"):
        evaluator.add(np.zeros((2, 21, CELLS, CELLS), np.float32), targets)
    with pytest.raises(ShapeError, match="targets of shape \\(3, 4, 5\\) for 2 images"):
        evaluator.add(np.zeros((2, 24, CELLS, CELLS), np.float32), np.zeros((3, 4, 5), np.float32))
