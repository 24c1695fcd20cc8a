"""The detector from the command line, as a user runs it: ``neuroflow train`` a tiny digit-canvas config for one
epoch, ``neuroflow evaluate --coco-json`` (files pycocotools reads, the same mAP), ``neuroflow predict`` (a PNG
with the boxes drawn), ``anchors = "kmeans"``, and the errors a user can hit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from neuroflow.cli import main
from neuroflow.config import load_config
from neuroflow.data import ArrayDataset
from neuroflow.errors import ConfigError
from neuroflow.losses.evaluation import FindsObjects, WritesCocoJson
from neuroflow_ops_vision.detection.anchors import kmeans_anchors
from neuroflow_ops_vision.detection.canvases import digit_canvases
from neuroflow_ops_vision.detection.loss import DetectionLoss
from neuroflow_ops_vision.detection.model import YoloLite
from neuroflow_ops_vision.detection.model_options import anchors_from_data

REPO = Path(__file__).resolve().parents[2]
# the example, made small: 48 canvases of 48 px, one epoch
TINY = {"n_train = 8000": "n_train = 48\nsize = 48\nmax_scale = 24", "n_test = 1000": "n_test = 12",
        "epochs = 8": "epochs = 1", "batch_size = 32": "batch_size = 16", "num_classes = 10": "num_classes = 10\nimage_size = 48"}


def tiny_config(directory: Path, **changes: str) -> Path:
    text = (REPO / "examples" / "detect_digits.toml").read_text()
    for old, new in {**TINY, **changes}.items():
        assert old in text, old
        text = text.replace(old, new)
    path = directory / "detect.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("detect")
    config = tiny_config(directory)
    assert main(["train", str(config)]) == 0
    return config, directory / "detect_digits.safetensors"


def test_the_example_config_names_a_detector_its_loss_and_kmeans_anchors():
    config = load_config(REPO / "examples" / "detect_digits.toml")
    assert config.model["name"] == "yolo_lite" and config.model["anchors"] == "kmeans"
    assert config.loss == {"type": "DetectionLoss"} and config.validate and config.epochs >= 1


def test_train_fits_kmeans_anchors_validates_each_epoch_and_saves(trained, capsys):
    config, model = trained
    assert model.is_file()
    train, _ = load_config(config).build_data()
    expected = np.round(kmeans_anchors(train[np.arange(len(train))][1], k=3, seed=0).astype(np.float64), 2)
    built = load_config(config).build_model(train)
    assert isinstance(built, YoloLite)
    np.testing.assert_allclose(built.anchors, expected, atol=1e-4)
    trainer = load_config(config).build_trainer(built)
    assert isinstance(trainer.loss, DetectionLoss) and trainer.loss.stride == built.stride
    np.testing.assert_array_equal(trainer.loss.anchors, built.anchors)


def test_evaluate_prints_map_and_writes_coco_files_pycocotools_agrees_with(trained, tmp_path, capsys):
    config, model = trained
    out = tmp_path / "coco"
    capsys.readouterr()
    assert main(["evaluate", str(config), "--model", str(model), "--coco-json", str(out)]) == 0
    printed = capsys.readouterr().out
    found = re.search(r"^mAP@0\.5 = (-?[0-9.]+)$", printed, re.M)
    assert found is not None, printed
    assert re.search(r"^loss = [0-9.]+$", printed, re.M)
    ground_truth = json.loads((out / "ground_truth.json").read_text())
    detections = json.loads((out / "detections.json").read_text())
    assert len(ground_truth["images"]) == 12 and ground_truth["annotations"]
    assert all(set(d) >= {"image_id", "category_id", "bbox", "score"} and len(d["bbox"]) == 4 for d in detections)
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        gt = coco.COCO(str(out / "ground_truth.json"))
        evaluation = cocoeval.COCOeval(gt, gt.loadRes(str(out / "detections.json")) if detections else gt, "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    if detections:
        assert abs(evaluation.stats[1] - float(found.group(1))) < 1e-3  # printed to 4 decimals


def test_predict_draws_the_boxes_on_a_png(trained, tmp_path, capsys):
    matplotlib_image = pytest.importorskip("matplotlib.image")
    config, model = trained
    images, _ = digit_canvases("test", 1, size=48, scales=(16, 24), seed=3)
    picture = tmp_path / "canvas.png"
    matplotlib_image.imsave(picture, images[0, 0], cmap="gray", vmin=0, vmax=1)
    out = tmp_path / "drawn" / "boxes.png"
    capsys.readouterr()
    assert main(["predict", str(config), "--model", str(model), str(picture), "--out", str(out), "--conf", "0"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^\d+ object\(s\) with score >= 0 in ", printed, re.M) and f"wrote {out}" in printed
    drawn = matplotlib_image.imread(out)
    assert drawn.ndim == 3 and min(drawn.shape[:2]) >= 48


def test_the_detectors_evaluator_writes_coco_json_and_finds_objects():
    evaluator = DetectionLoss.for_model(YoloLite(image_size=48)).evaluator()
    assert isinstance(evaluator, WritesCocoJson) and isinstance(evaluator, FindsObjects)


def test_detector_input_errors_are_clear(trained, tmp_path, capsys):
    config, model = trained
    assert main(["evaluate", str(config), "--model", str(tmp_path / "none.safetensors")]) == 2
    assert "--model: file" in capsys.readouterr().err
    assert main(["predict", str(config), "--model", str(model), str(tmp_path / "none.png")]) == 2
    assert re.search(r"picture '.*none\.png' not found", capsys.readouterr().err)
    (tmp_path / "bad.png").write_bytes(b"no png here")
    assert main(["predict", str(config), "--model", str(model), str(tmp_path / "bad.png")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["predict", str(config), "--model", str(model), str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_predict_letterboxes_a_picture_of_another_size_and_maps_the_boxes_back(trained, tmp_path, capsys):
    matplotlib_image = pytest.importorskip("matplotlib.image")
    config, model = trained
    images, _ = digit_canvases("test", 1, size=48, scales=(16, 24), seed=3)
    wide = np.concatenate([images[0, 0], images[0, 0]], axis=1)  # 48 x 96: scaled by 0.5, padded below
    colour = np.stack([wide, wide, wide * 0.5], axis=-1)
    matplotlib_image.imsave(tmp_path / "wide.png", colour)
    capsys.readouterr()
    assert main(["predict", str(config), "--model", str(model), str(tmp_path / "wide.png"), "--conf", "0",
                 "--out", str(tmp_path / "boxes.png")]) == 0
    printed = capsys.readouterr().out
    assert "the picture is 96 x 48 px; the detector takes 48 x 48: scaled by 0.5" in printed
    boxes = np.array([[float(v) for v in m.groups()] for m in
                      re.finditer(r"box \(([-0-9.]+), ([-0-9.]+), ([-0-9.]+), ([-0-9.]+)\)", printed)]).reshape(-1, 4)
    assert len(boxes) and (boxes >= 0).all() and (boxes[:, [0, 2]] <= 96).all() and (boxes[:, [1, 3]] <= 48).all()
    assert matplotlib_image.imread(tmp_path / "boxes.png").shape[1] > matplotlib_image.imread(
        tmp_path / "boxes.png").shape[0]  # drawn on the picture as given, not the letterboxed one
    assert main(["predict", str(config), "--model", str(model), str(tmp_path / "wide.png"), "--conf", "0",
                 "--no-agnostic"]) == 0
    per_class = len(re.findall(r"^  class ", capsys.readouterr().out, re.M))
    assert per_class >= len(boxes)  # class-agnostic NMS (the default) keeps no more boxes than per-class NMS


def test_an_int8_model_file_evaluates_like_the_float_one(trained, tmp_path, capsys):
    """The INT8 path a user takes: nf.save(..., quantize="int8") of the trained detector, neuroflow evaluate on it.
    (On the example's 1,000 held-out canvases after the full training: 0.9646 float32 and int8; pycocotools
    0.964611 and 0.964569.)"""
    import neuroflow as nf
    from neuroflow.checkpoint import quantization_of

    config, model = trained
    int8 = tmp_path / "int8.safetensors"
    nf.save(nf.load(model), int8, quantize="int8")
    assert int8.stat().st_size < model.stat().st_size / 3
    assert quantization_of(nf.load(int8)) == "int8"
    found = []
    for path in (model, int8):
        capsys.readouterr()
        assert main(["evaluate", str(config), "--model", str(path)]) == 0
        match = re.search(r"^mAP@0\.5 = (-?[0-9.]+)$", capsys.readouterr().out, re.M)
        assert match is not None
        found.append(float(match.group(1)))
    assert abs(found[0] - found[1]) <= 0.01, found


def test_evaluate_refuses_a_model_of_other_classes_and_an_unwritable_coco_dir(trained, tmp_path, capsys):
    import neuroflow as nf

    config, model = trained
    nf.save(YoloLite(num_classes=12, image_size=48), tmp_path / "twelve.safetensors")
    assert main(["evaluate", str(config), "--model", str(tmp_path / "twelve.safetensors")]) == 2
    assert "was built with num_classes = 12, but the config's [model] has num_classes = 10" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("")
    assert main(["evaluate", str(config), "--model", str(model), "--coco-json", str(tmp_path / "a_file" / "sub")]) == 2
    assert "--coco-json: cannot write into" in capsys.readouterr().err


@pytest.mark.parametrize(("changes", "match"), [
    ({"num_classes = 10": "num_classes = 3\nimage_size = 48"},
     r"num_classes = 3, but the training boxes have class ids up to 9; set num_classes = 10"),
    ({"n_train = 8000": "n_train = 8\nsize = 40\nmax_scale = 24"}, r"training images are 40 x 40 px; .*multiples of 16"),
    ({"n_train = 8000": "n_train = 8\nsize = 48\nmax_scale = 24\nmax_objects = 0"}, r"max_objects must be .*got 0"),
])
def test_configs_that_do_not_fit_the_data_are_refused_before_training(tmp_path, changes, match):
    with pytest.raises(ConfigError, match=match):
        config = load_config(tiny_config(tmp_path, **changes))
        config.build_model(config.build_data()[0])


def test_mem_profile_plans_the_detector_from_its_config(tmp_path, capsys):
    config = tiny_config(tmp_path, **{"n_train = 8000": "n_train = 8\nsize = 48\nmax_scale = 24"})
    assert main(["mem-profile", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "samples of shape (1, 48, 48) (from the model's input_shape)" in printed
    assert re.search(r"predicted peak of a training step: [0-9.]+ MiB", printed)


def test_anchors_other_than_kmeans_or_pairs_are_refused(tmp_path):
    config = load_config(tiny_config(tmp_path, **{'anchors = "kmeans"': 'anchors = "auto"'}))
    with pytest.raises(ConfigError, match=r"anchors must be three \[w, h\] pairs or 'kmeans'.*got 'auto'"):
        config.build_model()
    with pytest.raises(ValueError, match=r"needs training targets of boxes \(B, M, 5\); the training set has "
                                         r"targets of shape \(4,\)"):
        anchors_from_data({"anchors": "kmeans"}, ArrayDataset(np.zeros((4, 1, 16, 16), np.float32), np.arange(4)))
    assert anchors_from_data({"anchors": [[1, 2]] * 3}, None) == {"anchors": [[1, 2]] * 3}
    one_box = np.array([[[1, 0, 0, 10, 20], [-1, 0, 0, 0, 0]]], np.float32)
    with pytest.raises(ValueError, match=r"'kmeans' over 1 training image\(s\): .*at least k = 3 distinct box "
                                         r"shapes.*train on more images"):
        anchors_from_data({"anchors": "kmeans"}, ArrayDataset(np.zeros((1, 1, 16, 16), np.float32), one_box))


@pytest.mark.convergence
def test_the_example_reaches_map_0_9_on_1000_held_out_canvases(tmp_path, capsys):
    """The issue's target, as a user gets it: ``neuroflow train examples/detect_digits.toml`` (3 min 21 s on a
    2-core Xeon), then ``neuroflow evaluate --coco-json``; pycocotools' AP@0.5 on the files is at least 0.90."""
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    config = tmp_path / "detect_digits.toml"
    config.write_text((REPO / "examples" / "detect_digits.toml").read_text())
    assert main(["train", str(config)]) == 0
    assert main(["evaluate", str(config), "--model", str(tmp_path / "detect_digits.safetensors"),
                 "--coco-json", str(tmp_path / "coco")]) == 0
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        gt = coco.COCO(str(tmp_path / "coco" / "ground_truth.json"))
        evaluation = cocoeval.COCOeval(gt, gt.loadRes(str(tmp_path / "coco" / "detections.json")), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert len(gt.getImgIds()) == 1000
    assert evaluation.stats[1] >= 0.90
