"""``neuroflow train`` and ``evaluate`` around the held-out split, on a small .npz classifier: an empty test split
(reported, not evaluated; refused with validate = true before training), the model saved before any final
evaluation, ``evaluate`` reading the test split alone, and ``predict --conf`` outside [0, 1]. The detector's side
is tests/vision/test_detection_cli_checks.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neuroflow import registry
from neuroflow.cli import main
from neuroflow.data import ArrayDataset
from neuroflow.errors import NeuroFlowError
from neuroflow.trainer import Trainer

CONFIG = """
batch_size = 16
epochs = 1
seed = 0
validate = {validate}

[model]
layers = [{{ type = "Linear", in_features = 6, out_features = 3 }}]

[data]
{data}

[output]
save = "model.safetensors"
"""


def write_splits(directory: Path, n_test: int = 20) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("test", n_test)):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        np.savez(directory / f"{split}.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))


def write_config(directory: Path, validate: bool = False,
                 data: str = 'train = "train.npz"\ntest = "test.npz"') -> str:
    path = directory / "config.toml"
    path.write_text(CONFIG.format(validate=str(validate).lower(), data=data))
    return str(path)


def test_an_empty_test_split_is_reported_not_evaluated_and_the_model_is_saved(tmp_path, capsys):
    write_splits(tmp_path, n_test=0)
    assert main(["train", write_config(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "data: 48 training and 0 test samples" in printed
    assert "test: the test split is empty; nothing to evaluate" in printed
    assert f"saved the model to {tmp_path / 'model.safetensors'}" in printed
    assert (tmp_path / "model.safetensors").is_file()


def test_validate_with_an_empty_test_split_is_refused_before_training(tmp_path, capsys):
    write_splits(tmp_path, n_test=0)
    assert main(["train", write_config(tmp_path, validate=True)]) == 2
    captured = capsys.readouterr()
    assert ("error: validate = true evaluates the test split after every epoch, but the config's [data] gives an "
            "empty one (0 samples)") in captured.err
    assert "set validate = false" in captured.err
    assert "epoch" not in captured.out and not (tmp_path / "model.safetensors").exists()  # refused before training


def test_a_failing_final_evaluation_keeps_the_trained_model(tmp_path, capsys, monkeypatch):
    write_splits(tmp_path)

    def fails(self, data, evaluator=None):
        raise NeuroFlowError("the evaluation broke")

    monkeypatch.setattr(Trainer, "evaluate", fails)
    assert main(["train", write_config(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "error: the evaluation broke" in captured.err
    assert f"saved the model to {tmp_path / 'model.safetensors'}" in captured.out
    assert (tmp_path / "model.safetensors").is_file()


def test_the_saved_line_still_comes_after_the_test_metrics(tmp_path, capsys):
    write_splits(tmp_path)
    assert main(["train", write_config(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    test = next(i for i, line in enumerate(lines) if line.startswith("test: loss "))
    assert lines[test + 1].startswith("saved the model to ")


def test_evaluate_reads_the_test_file_alone_and_refuses_an_empty_one(tmp_path, capsys):
    write_splits(tmp_path)
    config = write_config(tmp_path)
    assert main(["train", config]) == 0
    (tmp_path / "train.npz").unlink()  # not needed to evaluate
    capsys.readouterr()
    assert main(["evaluate", config, "--model", str(tmp_path / "model.safetensors")]) == 0
    assert "on 20 held-out samples" in capsys.readouterr().out
    write_splits(tmp_path, n_test=0)
    assert main(["evaluate", config, "--model", str(tmp_path / "model.safetensors")]) == 2
    assert "the config's [data] gives an empty held-out split (0 samples) to evaluate on" in capsys.readouterr().err


class HeldOutOnly:
    """A data set whose source can build its held-out split alone; building the training one fails the test."""

    loss = None

    def __init__(self, *, n_test: int = 10) -> None:
        self.n_test = n_test

    def load(self):
        raise AssertionError("evaluate built the training split")

    def load_test(self) -> ArrayDataset:
        x = np.random.default_rng(1).standard_normal((self.n_test, 6)).astype(np.float32)
        return ArrayDataset(x, (x[:, 0] > 0).astype(np.int64))


@pytest.fixture
def held_out_only():
    registry.datasets.register("held_out_only", HeldOutOnly)
    yield
    registry.datasets.unregister("held_out_only")


def test_evaluate_builds_only_the_held_out_split_of_a_data_set_that_can(tmp_path, capsys, held_out_only):
    write_splits(tmp_path)
    assert main(["train", write_config(tmp_path)]) == 0
    config = write_config(tmp_path, data='dataset = "held_out_only"\nn_test = 7')
    capsys.readouterr()
    assert main(["evaluate", config, "--model", str(tmp_path / "model.safetensors")]) == 0
    assert "on 7 held-out samples" in capsys.readouterr().out


@pytest.mark.parametrize("conf", ["-1", "nan", "2", "inf", "high"])
def test_predict_refuses_a_conf_outside_0_to_1(tmp_path, capsys, conf):
    write_splits(tmp_path)
    argv = ["predict", write_config(tmp_path), "picture.png", "--model", "model.safetensors", f"--conf={conf}"]
    assert main(argv) == 2
    assert "argument --conf: expected a score from 0 to 1; got" in capsys.readouterr().err
