"""mAP@0.5 against pycocotools' COCOeval (stats[1]) on many scenes, its definition, and the COCO json files."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow_ops_vision.detection.metric import (
    average_precisions,
    coco_detections,
    coco_ground_truth,
    mean_average_precision,
    write_coco_json,
)

SIZE = 96
CLASSES = 4


def cocoeval_ap50(detections: list[np.ndarray], ground_truth: list[np.ndarray], num_classes: int | None = None,
                  files: Path | None = None) -> float:
    """pycocotools' AP at IoU=.50, area all, maxDets=100, from our COCO dicts (or the files written to ``files``)."""
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    with contextlib.redirect_stdout(io.StringIO()):
        if files is None:
            truth = coco.COCO()
            truth.dataset = coco_ground_truth(ground_truth, SIZE, num_classes)
            truth.createIndex()
            found = truth.loadRes(coco_detections(detections))
        else:
            truth_path, found_path = write_coco_json(files, ground_truth, detections, SIZE, num_classes)
            truth = coco.COCO(str(truth_path))
            found = truth.loadRes(str(found_path))
        evaluation = cocoeval.COCOeval(truth, found, "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return float(evaluation.stats[1])


def boxes_xyxy(rng: np.random.Generator, n: int, spread: float, small: float = 8.0, large: float = 36.0) -> np.ndarray:
    corner = rng.uniform(0, spread, (n, 2))
    return np.concatenate([corner, np.minimum(corner + rng.uniform(small, large, (n, 2)), SIZE)], axis=1)


def scene(rng: np.random.Generator, images: int = 12, max_objects: int = 6, spread: float = 58.0,
          ties: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Ground truth, and detections that are jittered copies (some of the wrong class) plus false positives."""
    detections, ground_truth = [], []
    for _ in range(images):
        k = int(rng.integers(0, max_objects + 1))
        truth = np.concatenate([rng.integers(0, CLASSES, (k, 1)), boxes_xyxy(rng, k, spread)], axis=1)
        rows = []
        for label, *box in truth:
            for _ in range(int(rng.integers(0, 3))):
                wrong = rng.random() < 0.15
                rows.append([*(np.array(box) + rng.normal(0, 3, 4)), rng.random(),
                             rng.integers(0, CLASSES) if wrong else label])
        false = boxes_xyxy(rng, int(rng.integers(0, 5)), 70.0, 4.0, 30.0)
        rows += [[*box, rng.random(), rng.integers(0, CLASSES)] for box in false]
        found = np.array(rows, dtype=np.float32).reshape(-1, 6)
        if ties:
            found[:, 4] = np.round(found[:, 4], 1)
        detections.append(found[np.argsort(-found[:, 4], kind="stable")])
        ground_truth.append(truth.astype(np.float32))
    return detections, ground_truth


@pytest.mark.parametrize("seed", range(16))
def test_random_scenes_agree_with_cocoeval(seed: int) -> None:
    detections, ground_truth = scene(np.random.default_rng(seed), ties=seed % 2 == 1)
    assert mean_average_precision(detections, ground_truth) == pytest.approx(
        cocoeval_ap50(detections, ground_truth), abs=1e-4)


@pytest.mark.parametrize("seed", range(6))
def test_crowded_scenes_agree_with_cocoeval(seed: int) -> None:
    # many overlapping objects of few classes in a small area: matching order and tie rules decide
    detections, ground_truth = scene(np.random.default_rng(100 + seed), images=6, max_objects=25, spread=16.0,
                                     ties=True)
    assert mean_average_precision(detections, ground_truth) == pytest.approx(
        cocoeval_ap50(detections, ground_truth), abs=1e-4)


def test_more_than_max_dets_per_image_agree_with_cocoeval(rng: np.random.Generator) -> None:
    detections, ground_truth = scene(rng, images=4, max_objects=20, spread=20.0)
    extra = [np.concatenate([d, np.column_stack([boxes_xyxy(rng, 150, 70.0), rng.random(150) * 0.9,
                                                 np.zeros(150)]).astype(np.float32)]) for d in detections]
    ours = mean_average_precision(extra, ground_truth)
    assert ours == pytest.approx(cocoeval_ap50(extra, ground_truth), abs=1e-4)
    assert mean_average_precision(extra, ground_truth, max_dets=10**6) != ours


def test_duplicates_count_once() -> None:
    truth = [np.array([[0, 10, 10, 40, 40], [1, 50, 50, 80, 80]], dtype=np.float32)]
    box = [10, 10, 40, 40]
    found = [np.array([[*box, 0.9, 0], [*box, 0.9, 0], [*box, 0.8, 0], [50, 50, 80, 80, 0.7, 1],
                       [50, 50, 80, 80, 0.95, 1]], dtype=np.float32)]
    ours = mean_average_precision(found, truth)
    assert ours == pytest.approx(cocoeval_ap50(found, truth), abs=1e-4)
    assert ours == pytest.approx(1.0)  # a duplicate ranked after its true positive cannot lower AP
    # a duplicate ranked between two true positives does lower it
    between = [np.array([[*box, 0.9, 0], [*box, 0.8, 0], [50, 50, 80, 80, 0.7, 0]], dtype=np.float32)]
    two = [np.array([[0, 10, 10, 40, 40], [0, 50, 50, 80, 80]], dtype=np.float32)]
    ours = mean_average_precision(between, two)
    assert ours == pytest.approx(cocoeval_ap50(between, two), abs=1e-4)
    assert ours < 1.0


def test_a_false_positive_ranked_first_halves_ap() -> None:
    truth = [np.array([[0, 10, 10, 40, 40]], dtype=np.float32)]
    found = [np.array([[60, 60, 90, 90, 0.9, 0], [10, 10, 40, 40, 0.8, 0]], dtype=np.float32)]
    assert mean_average_precision(found, truth) == pytest.approx(0.5)
    assert cocoeval_ap50(found, truth) == pytest.approx(0.5)


def test_images_without_ground_truth_or_detections(rng: np.random.Generator) -> None:
    detections, ground_truth = scene(rng, images=10)
    ground_truth[2] = np.zeros((0, 5), np.float32)
    ground_truth[5] = np.zeros((0, 5), np.float32)
    detections[3] = np.zeros((0, 6), np.float32)
    detections[5] = np.zeros((0, 6), np.float32)
    assert mean_average_precision(detections, ground_truth) == pytest.approx(
        cocoeval_ap50(detections, ground_truth), abs=1e-4)


def test_classes_with_detections_but_no_ground_truth_are_left_out() -> None:
    truth = [np.array([[0, 10, 10, 40, 40]], dtype=np.float32)]
    found = [np.array([[10, 10, 40, 40, 0.9, 0], [10, 10, 40, 40, 0.99, 3]], dtype=np.float32)]
    assert average_precisions(found, truth, num_classes=CLASSES) == {0: pytest.approx(1.0)}
    assert mean_average_precision(found, truth, num_classes=CLASSES) == pytest.approx(1.0)
    assert cocoeval_ap50(found, truth, num_classes=CLASSES) == pytest.approx(1.0)


def test_perfect_detections_score_one(rng: np.random.Generator) -> None:
    _, ground_truth = scene(rng, images=8)
    perfect = [np.column_stack([t[:, 1:], rng.random(len(t)), t[:, 0]]).astype(np.float32) for t in ground_truth]
    assert mean_average_precision(perfect, ground_truth) == pytest.approx(1.0)
    assert cocoeval_ap50(perfect, ground_truth) == pytest.approx(1.0)


def test_no_detections_at_all_is_zero(rng: np.random.Generator) -> None:
    # pycocotools cannot load an empty result list; by the definition every category's precision is 0
    _, ground_truth = scene(rng, images=5)
    nothing = [np.zeros((0, 6), np.float32) for _ in ground_truth]
    assert mean_average_precision(nothing, ground_truth) == 0.0
    assert set(average_precisions(nothing, ground_truth).values()) == {0.0}


def test_no_ground_truth_at_all_is_minus_one_as_coco() -> None:
    truth = [np.zeros((0, 5), np.float32), np.zeros((0, 5), np.float32)]
    found = [np.array([[10, 10, 40, 40, 0.9, 0]], np.float32), np.zeros((0, 6), np.float32)]
    assert mean_average_precision(found, truth) == -1.0
    assert cocoeval_ap50(found, truth, num_classes=CLASSES) == -1.0
    assert mean_average_precision([], []) == -1.0


def test_inverted_detection_boxes_are_ignored_as_coco_does(rng: np.random.Generator) -> None:
    detections, ground_truth = scene(rng, images=6)
    inverted = np.array([[40, 40, 20, 60, 0.99, 0], [5, 5, 20, 20, 0.98, 1]], np.float32)  # the first: w < 0
    detections[0] = np.concatenate([inverted, detections[0]])
    assert mean_average_precision(detections, ground_truth) == pytest.approx(
        cocoeval_ap50(detections, ground_truth), abs=1e-4)


def test_ap_at_other_iou_thresholds() -> None:
    truth = [np.array([[0, 0, 0, 10, 10]], dtype=np.float32)]
    found = [np.array([[0, 0, 10, 7, 0.9, 0]], dtype=np.float32)]  # IoU 0.7
    assert mean_average_precision(found, truth, iou=0.7) == pytest.approx(1.0)
    assert mean_average_precision(found, truth, iou=0.75) == 0.0
    exact = [np.array([[0, 0, 10, 10, 0.9, 0]], dtype=np.float32)]
    assert mean_average_precision(exact, truth, iou=1.0) == pytest.approx(1.0)


def test_coco_files_hold_the_same_figure(tmp_path: Path, rng: np.random.Generator) -> None:
    detections, ground_truth = scene(rng, images=10)
    ours = mean_average_precision(detections, ground_truth, num_classes=CLASSES)
    assert cocoeval_ap50(detections, ground_truth, CLASSES, files=tmp_path / "coco") == pytest.approx(ours, abs=1e-4)
    truth = json.loads((tmp_path / "coco" / "ground_truth.json").read_text())
    found = json.loads((tmp_path / "coco" / "detections.json").read_text())
    assert [c["id"] for c in truth["categories"]] == list(range(CLASSES))
    assert len(truth["images"]) == 10 and truth["images"][0] == {"id": 0, "width": SIZE, "height": SIZE}
    assert len(found) == sum(len(d) for d in detections)
    first = found[0]
    assert set(first) == {"image_id", "category_id", "bbox", "score"}
    x1, y1, x2, y2, score, label = detections[0][0].astype(np.float64)
    assert first["image_id"] == 0 and first["category_id"] == int(label)
    assert first["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1]) and first["score"] == pytest.approx(score)


def test_coco_ground_truth_fields() -> None:
    truth = [np.array([[2, 1, 2, 11, 22]], np.float32), np.zeros((0, 5), np.float32)]
    coco = coco_ground_truth(truth, (48, 64))
    assert coco["images"] == [{"id": 0, "width": 64, "height": 48}, {"id": 1, "width": 64, "height": 48}]
    assert coco["annotations"] == [{"id": 1, "image_id": 0, "category_id": 2, "bbox": [1.0, 2.0, 10.0, 20.0],
                                    "area": 200.0, "iscrowd": 0}]
    assert coco["categories"] == [{"id": 2, "name": "2"}]


@pytest.mark.parametrize(("detections", "ground_truth", "kwargs", "error", "match"), [
    ([np.zeros((0, 6))], [], {}, ValueError, "detections for 1 images and ground truth for 0"),
    ([np.zeros((1, 5))], [np.zeros((0, 5))], {}, ShapeError, "detections of image 0 has shape \\(1, 5\\)"),
    ([np.zeros((0, 6))], [np.zeros((2, 4))], {}, ShapeError, "ground truth of image 0 has shape \\(2, 4\\)"),
    ([np.zeros((0, 6))], [np.array([[-1, 0, 0, 0, 0]])], {}, ValueError, "class -1.*padding rows"),
    ([np.zeros((0, 6))], [np.array([[4, 0, 0, 5, 5]])], {"num_classes": 4}, ValueError,
     "class 4; expected integers in \\[0, 4\\)"),
    ([np.array([[0, 0, 5, 5, 0.5, 1.5]])], [np.zeros((0, 5))], {}, ValueError, "class 1.5"),
    ([np.zeros((0, 6))], [np.array([[0, 5, 5, 5, 9]])], {}, ValueError, "zero-area box"),
    ([np.array([[0, 0, 5, np.nan, 0.5, 0]])], [np.zeros((0, 5))], {}, ValueError, "non-finite"),
    ([np.zeros((0, 6))], [np.zeros((0, 5))], {"iou": 0.0}, ValueError, "iou=0.0"),
    ([np.zeros((0, 6))], [np.zeros((0, 5))], {"max_dets": 0}, ValueError, "max_dets=0"),
])
def test_bad_input_is_refused(detections: list[np.ndarray], ground_truth: list[np.ndarray], kwargs: dict[str, Any],
                              error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        mean_average_precision(detections, ground_truth, **kwargs)


def test_write_coco_json_refuses_mismatched_lists(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="detections for 0 images and ground truth for 1"):
        write_coco_json(tmp_path, [np.zeros((0, 5))], [], SIZE)
    assert not list(tmp_path.iterdir())
