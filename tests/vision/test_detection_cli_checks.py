"""The detector's command line where a user's input is off: no test canvases (``n_test = 0``), ``predict --out``
names that matplotlib would change or refuse, a model of another ``image_size`` than the config's default, and
box labels at the picture's edges (drawn inside it)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from neuroflow.cli import main
from neuroflow.cli.predict import labelled_figure, matplotlib_modules

from .test_detection_cli import tiny_config

matplotlib_image = pytest.importorskip("matplotlib.image")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny config (48-px canvases, ``image_size = 48``), trained for one epoch and saved, and a picture."""
    directory = tmp_path_factory.mktemp("detect_checks")
    config = tiny_config(directory, **{"validate = true": "validate = false"})
    assert main(["train", str(config)]) == 0
    matplotlib_image.imsave(directory / "canvas.png", np.zeros((48, 48)), cmap="gray", vmin=0, vmax=1)
    return config, directory / "detect_digits.safetensors", directory / "canvas.png"


@pytest.mark.parametrize("validate", ["true", "false"])
def test_no_test_canvases_train_and_save_or_are_refused_with_validate(tmp_path, capsys, validate):
    config = tiny_config(tmp_path, **{"n_test = 1000": "n_test = 0", "validate = true": f"validate = {validate}"})
    model = tmp_path / "detect_digits.safetensors"
    if validate == "true":
        assert main(["train", str(config)]) == 2
        captured = capsys.readouterr()
        assert "validate = true evaluates the test split after every epoch, but the config's [data] gives an " \
               "empty one (0 samples)" in captured.err
        assert "epoch 1/1" not in captured.out and not model.exists()
    else:
        assert main(["train", str(config)]) == 0
        printed = capsys.readouterr().out
        assert "test: the test split is empty; nothing to evaluate" in printed
        assert "saved the model to" in printed and model.is_file()


@pytest.mark.parametrize(("out", "match"), [
    ("pred/noext", r"--out: '.*pred/noext' has no ending; give a file name ending in \.png"),
    ("x.bmp", r"--out: '.*x\.bmp' ends in '\.bmp'; give a file name ending in \.png \(or another format .*jpg"),
    ("a_dir", r"--out: '.*a_dir' is a directory; give a picture file name, such as '.*a_dir/boxes\.png'"),
    ("a_file/boxes.png", r"--out: cannot write into '.*a_file' \(.*\); give a directory you can write to"),
])
def test_out_is_checked_before_the_model_is_read(tmp_path, capsys, out, match):
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "a_file").write_text("")
    matplotlib_image.imsave(tmp_path / "canvas.png", np.zeros((48, 48)), cmap="gray")
    argv = ["predict", str(tiny_config(tmp_path)), str(tmp_path / "canvas.png"), "--out", str(tmp_path / out),
            "--model", str(tmp_path / "none.safetensors")]  # no such model: --out's error comes first
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert not (tmp_path / "pred").exists() and not (tmp_path / "x.bmp").exists()


def test_out_writes_the_file_it_names_in_the_format_its_name_gives(trained, tmp_path, capsys):
    config, model, picture = trained
    out = tmp_path / "drawn" / "boxes.jpg"
    assert main(["predict", str(config), "--model", str(model), str(picture), "--out", str(out), "--conf", "0"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG, at exactly the path given
    assert sorted(p.name for p in out.parent.iterdir()) == ["boxes.jpg"]


def test_a_model_of_another_image_size_than_the_configs_default_is_refused(trained, tmp_path, capsys):
    config, model, picture = trained
    default = tiny_config(tmp_path, **{"num_classes = 10": "num_classes = 10"})  # no image_size: yolo_lite's 96
    expected = (f"--model: '{model}' was built with image_size = 48, but the config's [model] has image_size = 96 "
                "(the default of yolo_lite: the config leaves it out)")
    assert main(["evaluate", str(default), "--model", str(model)]) == 2
    assert expected in capsys.readouterr().err
    assert main(["predict", str(default), "--model", str(model), str(picture)]) == 2
    assert expected in capsys.readouterr().err
    assert main(["evaluate", str(config), "--model", str(model)]) == 0  # the config it was trained with


def test_labels_at_every_edge_of_the_picture_stay_inside_it():
    plt = matplotlib_modules().pyplot
    size = 48.0
    objects = np.array([  # x1, y1, x2, y2, score, class
        [10, 0, 30, 20, 0.9, 1],  # at the top edge
        [31, 0, 47, 12, 0.8, 2],  # at the top edge, beside it
        [0, 20, 10, 30, 0.7, 3],  # at the left edge
        [40, 20, size, 30, 0.6, 4],  # at the right edge
        [15, 36, 25, size, 0.5, 5],  # at the bottom edge
        [0, 0, size, size, 0.4, 6],  # the whole picture
        [44, 0, size, 4, 0.3, 7],  # a small box in the top-right corner
        [0, 44, 4, size, 0.2, 8],  # a small box in the bottom-left corner
    ], dtype=np.float32)
    fig = labelled_figure(np.zeros((48, 48), np.float32), objects)
    try:
        renderer = fig.canvas.get_renderer()
        picture = fig.bbox
        labels = fig.axes[0].texts
        assert len(labels) == len(objects)
        for label, row in zip(labels, objects):
            extent = label.get_window_extent(renderer)
            assert (picture.x0 - 1e-6 <= extent.x0 and extent.x1 <= picture.x1 + 1e-6
                    and picture.y0 - 1e-6 <= extent.y0 and extent.y1 <= picture.y1 + 1e-6), (row, extent, picture)
        top = fig.axes[0].transData.transform((0, -0.5))[1]  # the picture's top edge, in display pixels
        first = labels[0].get_window_extent(renderer)
        assert first.y1 <= top + 1e-6 and first.x0 >= fig.axes[0].transData.transform((9.5, 0))[0] - 1e-6
    finally:
        plt.close(fig)


def test_a_detector_read_with_a_classifiers_loss_is_refused_not_printed_as_classes(trained, tmp_path, capsys):
    config, model, picture = trained
    text = config.read_text()
    assert 'type = "DetectionLoss"' in text
    classifier = tmp_path / "classifier.toml"
    classifier.write_text(text.replace('type = "DetectionLoss"', 'type = "CrossEntropy"'))
    assert main(["predict", str(classifier), "--model", str(model), str(picture)]) == 2
    captured = capsys.readouterr()
    assert "not the (batch, classes) scores of a classifier" in captured.err and "class " not in captured.out
