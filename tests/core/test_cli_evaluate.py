"""The evaluator hook (Loss.evaluator, merged by Trainer.evaluate), plugin losses and model-built losses in a
config, options computed from the training data, and the ``neuroflow evaluate`` / ``predict`` commands on a
classifier (the detector's side is tests/vision/test_detection_cli.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from neuroflow import Trainer, registry
from neuroflow.cli import main
from neuroflow.composites import Sequential
from neuroflow.config import Config, load_config
from neuroflow.config.from_data import options_from_data, resolver_of
from neuroflow.errors import ConfigError, UnknownNameError
from neuroflow.losses import MSE, CrossEntropy, Loss
from neuroflow.losses.evaluation import Evaluator, FindsObjects, WritesCocoJson, evaluator_of
from neuroflow.ops import Linear

CONFIG = """
batch_size = 16
epochs = 1
seed = 0

[model]
layers = [{{ type = "Linear", in_features = 6, out_features = 3 }}]

[data]
train = "train.npz"
test = "test.npz"
{extra}
"""


@pytest.fixture
def workdir(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("test", 20)):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        np.savez(tmp_path / f"{split}.npz", x=x, y=(x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1))
    return tmp_path


def write_config(directory: Path, extra: str = "") -> str:
    path = directory / "config.toml"
    path.write_text(CONFIG.format(extra=extra))
    return str(path)


class CountingEvaluator:
    """Counts the samples and sums the first output column: a metric the mean loss does not give."""

    def __init__(self) -> None:
        self.seen, self.total = 0, 0.0

    def add(self, output: np.ndarray, targets: np.ndarray) -> None:
        assert isinstance(output, np.ndarray) and isinstance(targets, np.ndarray)
        assert len(output) == len(targets)
        self.seen += len(output)
        self.total += float(output[:, 0].sum())

    def result(self) -> dict[str, float]:
        return {"seen": float(self.seen), "column0": self.total}


class CountedCrossEntropy(CrossEntropy):
    made = 0

    def evaluator(self) -> CountingEvaluator:
        CountedCrossEntropy.made += 1
        return CountingEvaluator()


class ModelLoss(MSE):
    """A loss configured from the model it trains (as a detector's reads anchors and stride)."""

    def __init__(self, width: int, scale: float = 1.0) -> None:
        super().__init__()
        self.width, self.scale = width, scale

    @classmethod
    def for_model(cls, model, scale: float = 1.0) -> ModelLoss:
        return cls(model.layers[0].weight.shape[0], scale)


# ---------------------------------------------------------------- the hook
def test_a_loss_has_no_evaluator_by_default():
    assert Loss().evaluator() is None and CrossEntropy().evaluator() is None
    assert evaluator_of(CrossEntropy()) is None and evaluator_of(object()) is None


def test_trainer_evaluate_merges_a_fresh_evaluators_metrics_each_call():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((20, 6)).astype(np.float32), rng.integers(0, 3, 20)
    trainer = Trainer(Sequential(Linear(6, 3)), loss=CountedCrossEntropy(), batch_size=8, progress=False)
    before = CountedCrossEntropy.made
    metrics = trainer.evaluate((x, y))
    assert set(metrics) == {"loss", "accuracy", "seen", "column0"}
    assert metrics["seen"] == 20.0
    np.testing.assert_allclose(metrics["column0"], _column0(trainer, x), rtol=1e-4, atol=1e-4)
    assert trainer.evaluate((x, y))["seen"] == 20.0  # a new evaluator: counts do not carry over
    assert CountedCrossEntropy.made == before + 2


def _column0(trainer: Trainer, x: np.ndarray) -> float:
    return float((x @ trainer.model.layers[0].weight.data.T + trainer.model.layers[0].bias.data)[:, 0].sum())


def test_trainer_evaluate_fills_the_evaluator_it_is_given_and_fit_validates_with_it():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((12, 6)).astype(np.float32), rng.integers(0, 3, 12)
    trainer = Trainer(Sequential(Linear(6, 3)), loss=CountedCrossEntropy(), batch_size=4, progress=False)
    given = CountingEvaluator()
    assert trainer.evaluate((x, y), given)["seen"] == 12.0 and given.seen == 12
    history = trainer.fit((x, y), epochs=1, val_data=(x, y))
    assert history[-1]["val_seen"] == 12.0


def test_the_protocols_are_checkable():
    assert isinstance(CountingEvaluator(), Evaluator)
    assert not isinstance(CountingEvaluator(), WritesCocoJson | FindsObjects)


# ---------------------------------------------------------------- config: plugin losses, model-built losses
@pytest.fixture
def registered():
    """Register objects at run time in a registry (registry.losses, registry.models); removed after the test."""
    added = []

    def add(reg, name, obj):
        reg.register(name, obj)
        added.append((reg, name))

    yield add
    for reg, name in added:
        reg.unregister(name)


def test_a_plugin_loss_is_named_by_type(workdir, registered):
    registered(registry.losses, "CountedCrossEntropy", CountedCrossEntropy)
    config = load_config(write_config(workdir, "[loss]\ntype = 'countedcrossentropy'\n"))
    assert type(config.build_loss()) is CountedCrossEntropy


def test_a_loss_with_for_model_is_built_from_the_model_and_its_keys(workdir, registered):
    registered(registry.losses, "ModelLoss", ModelLoss)
    config = load_config(write_config(workdir, "[loss]\ntype = 'ModelLoss'\nscale = 2.5\n"))
    trainer = config.build_trainer(config.build_model())
    assert isinstance(trainer.loss, ModelLoss) and (trainer.loss.width, trainer.loss.scale) == (3, 2.5)
    with pytest.raises(ConfigError, match=r"\[loss\] \(ModelLoss\): this loss is built from the model"):
        config.build_loss()
    bad = load_config(write_config(workdir, "[loss]\ntype = 'ModelLoss'\nscale = 'big'\n"))
    with pytest.raises(ConfigError, match=r"\[loss\] \(ModelLoss\): 'scale' must be a number; got 'big'"):
        bad.build_trainer(bad.build_model())


def test_an_unknown_loss_lists_core_and_plugin_losses_and_a_known_one_names_its_distribution(workdir, monkeypatch):
    config = load_config(write_config(workdir, "[loss]\ntype = 'Hinge'\n"))
    with pytest.raises(UnknownNameError, match=r"Hinge.*CrossEntropy"):
        config.build_loss()
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_losses"], "FocalLoss", "neuroflow-ops-fancy")
    config = load_config(write_config(workdir, "[loss]\ntype = 'FocalLoss'\n"))
    with pytest.raises(UnknownNameError, match=r"pip install neuroflow-ops-fancy"):
        config.build_loss()


def test_the_losses_group_is_a_registry_neuroflow_plugins_lists():
    assert registry.losses in registry.ALL and registry.losses.group == "neuroflow_losses"


# ---------------------------------------------------------------- options from the training data
def _resolve(options, train):
    if options.get("out_features") == "classes":
        _, y = train[np.arange(len(train))]
        return {**options, "out_features": int(y.max()) + 1}
    return options


@options_from_data(_resolve)
def counted_linear(in_features: int = 6, out_features: int = 3) -> Sequential:
    return Sequential(Linear(in_features, out_features))


def test_a_builder_marked_options_from_data_gets_the_training_set(workdir, registered):
    assert resolver_of(counted_linear) is _resolve and resolver_of(Linear) is None
    registered(registry.models, "counted_linear", counted_linear)
    config = Config.from_dict({"model": {"name": "counted_linear", "out_features": "classes"},
                               "data": {"train": "train.npz", "test": "test.npz"}}, source=workdir / "c.toml")
    train, _ = config.build_data()
    assert config.build_model(train).layers[0].weight.shape == (3, 6)
    assert config.build_model().layers[0].weight.shape == (3, 6)  # loads the training set itself


def test_validate_is_a_boolean_top_level_key(workdir):
    assert load_config(write_config(workdir, "")).validate is False
    path = workdir / "v.toml"
    path.write_text("validate = true\n" + CONFIG.format(extra=""))
    assert load_config(path).validate is True
    path.write_text("validate = 1\n" + CONFIG.format(extra=""))
    with pytest.raises(ConfigError, match=r"'validate' must be true or false"):
        load_config(path)


def test_train_with_validate_prints_the_validation_metrics(workdir, capsys):
    path = workdir / "v.toml"
    path.write_text("validate = true\n" + CONFIG.format(extra=""))
    assert main(["train", str(path)]) == 0
    assert "val_loss=" in capsys.readouterr().out


# ---------------------------------------------------------------- neuroflow evaluate / predict on a classifier
@pytest.fixture
def trained(workdir):
    path = write_config(workdir)
    assert main(["train", path, "--save", str(workdir / "model.safetensors")]) == 0
    return path, str(workdir / "model.safetensors")


def test_evaluate_prints_loss_and_accuracy_of_a_saved_classifier(trained, capsys):
    config, model = trained
    capsys.readouterr()
    assert main(["evaluate", config, "--model", model]) == 0
    out = capsys.readouterr().out
    assert "on 20 held-out samples" in out
    assert [line.split(" = ")[0] for line in out.splitlines()[1:]] == ["loss", "accuracy"]


def test_evaluate_errors_name_the_problem(trained, workdir, capsys):
    config, model = trained
    assert main(["evaluate", config, "--model", str(workdir / "nope.safetensors")]) == 2
    assert "--model: file" in capsys.readouterr().err
    assert main(["evaluate", config, "--model", model, "--coco-json", str(workdir / "coco")]) == 2
    err = capsys.readouterr().err
    assert "--coco-json: the loss CrossEntropy has no evaluator" in err and not (workdir / "coco").exists()
    assert main(["evaluate", config]) == 2  # --model is required
    no_test = workdir / "no_test.toml"
    no_test.write_text(CONFIG.format(extra="").replace('test = "test.npz"\n', ""))
    assert main(["evaluate", str(no_test), "--model", model]) == 2
    assert "no held-out split" in capsys.readouterr().err


def test_predict_prints_a_classifiers_top_classes(trained, workdir, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    config, model = trained
    path = Path(config)
    path.write_text(path.read_text().replace("[model]\n", "[model]\ninput_shape = [6]\n"))
    matplotlib.image.imsave(workdir / "row.png", np.linspace(0, 1, 6).reshape(2, 3), cmap="gray")
    capsys.readouterr()
    assert main(["predict", config, "--model", model, str(workdir / "row.png"), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("top classes of") and len(lines) == 3 and lines[1].strip().startswith("class ")
    assert main(["predict", config, "--model", model, str(workdir / "row.png"), "--out", str(workdir / "b.png")]) == 2
    assert "--out draws the objects a detector finds; the loss CrossEntropy finds no objects" in capsys.readouterr().err
    assert main(["predict", config, "--model", model, str(workdir / "missing.png")]) == 2
    assert "picture" in capsys.readouterr().err
    matplotlib.image.imsave(workdir / "big.png", np.zeros((4, 4)), cmap="gray")
    assert main(["predict", config, "--model", model, str(workdir / "big.png")]) == 2
    assert "takes input_shape [6] (6 values)" in capsys.readouterr().err


def test_predict_without_matplotlib_names_the_install_command(trained, workdir, capsys, monkeypatch):
    config, model = trained
    (workdir / "x.png").write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["predict", config, "--model", model, str(workdir / "x.png")]) == 2
    assert "pip install 'neuroflow-core[plot]'" in capsys.readouterr().err
