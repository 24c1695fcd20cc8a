"""TOML configs: validation of every key and type, and building model, trainer and data from them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from neuroflow import registry
from neuroflow.config import TRAINER_KEYS, Config, load_config, resolve_model_config
from neuroflow.data import ArrayDataset
from neuroflow.errors import ConfigError, UnknownNameError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_mlp.toml"

TINY = """
batch_size = 16
epochs = 1
seed = 3

[model]
layers = [
    {{ type = "Linear", in_features = 6, out_features = 8 }},
    {{ type = "ReLU" }},
    {{ type = "Linear", in_features = 8, out_features = 3 }},
]
{extra}
"""


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def tiny(tmp_path: Path, extra: str = "") -> Config:
    return load_config(write(tmp_path, TINY.format(extra=extra)))


def test_example_config_builds_the_mlp_and_its_trainer_without_touching_data():
    config = load_config(EXAMPLE)
    assert config.epochs == 2
    assert config.trainer["batch_size"] == 64
    model = config.build_model()
    assert [repr(layer) for layer in model] == [
        "Linear(784→128)", "ReLU()", "Linear(128→64)", "ReLU()", "Linear(64→10)",
    ]
    trainer = config.build_trainer(model)
    assert type(trainer.optimizer).__name__ == "AdamW"
    assert trainer.optimizer.lr == pytest.approx(2e-3)
    assert type(trainer.scheduler).__name__ == "Cosine"
    assert type(trainer.loss).__name__ == "CrossEntropy"
    assert trainer.batch_size == 64
    assert config.data == {"dataset": "mnist", "flat": True, "normalize": True}


def test_seed_makes_model_initialisation_reproducible(tmp_path):
    a = tiny(tmp_path).build_model()
    b = tiny(tmp_path).build_model()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=name)


@pytest.mark.parametrize(("text", "expected"), [
    ("batchsize = 3\n[model]\nname = 'x'", r"unknown key 'batchsize' at the top level; valid keys: device, batch_size"),
    ("[model]\nname = 'x'\n[optimiser]\ntype = 'SGD'", r"unknown key 'optimiser' at the top level; valid keys: .*\[optimizer\]"),
    ("[model]\nname = 'x'\n[data]\ndataset = 'mnist'\nshufle = true",
     r"unknown key 'shufle' in \[data\]; valid keys: dataset, path, flat, normalize$"),
    ("[model]\nname = 'x'\n[output]\nsave = 'a'\nformat = 'b'", r"unknown key 'format' in \[output\]; valid keys: save"),
    ("[model]\nlayers = [{type = 'ReLU'}]\nwidth = 3", r"unknown key 'width' in \[model\]; valid keys: name, layers"),
])
def test_unknown_key_names_it_its_table_and_the_valid_keys(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text))


def test_unknown_constructor_key_lists_the_constructors_keys(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Linear', in_feature = 3, out_features = 2}]"))
    with pytest.raises(ConfigError, match=r"unknown key 'in_feature' in \[model\] layers\[0\] \(Linear\); "
                                          r"valid keys: type, in_features, out_features, bias"):
        config.build_model()
    config = tiny(tmp_path, "[optimizer]\ntype = 'AdamW'\nlrr = 0.1")
    with pytest.raises(ConfigError, match=r"unknown key 'lrr' in \[optimizer\] \(AdamW\); valid keys: type, lr, betas"):
        config.build_trainer(config.build_model())


@pytest.mark.parametrize(("text", "expected"), [
    ("batch_size = '64'\n[model]\nname = 'x'", r"'batch_size' must be an integer; got '64'"),
    ("batch_size = 6.5\n[model]\nname = 'x'", r"'batch_size' must be an integer; got 6.5"),
    ("clip_grad_norm = true\n[model]\nname = 'x'", r"'clip_grad_norm' must be a number; got True"),
    ("[model]\nname = 'x'\n[data]\ndataset = 'mnist'\nflat = 1", r"\[data\]: 'flat' must be true or false; got 1"),
    ("model = 3", r"'model' must be a table; got 3"),
    ("[model]\nlayers = ['Linear']", r"\[model\] layers\[0\] must be a table with type"),
    ("[model]\nname = 'x'\ninput_shape = [0, 3]", r"'input_shape' must be an array of positive integers"),
    ("[model]\nname = 'x'\n[optimizer]\nlr = 0.1", r"\[optimizer\] needs type"),
])
def test_wrong_types_name_the_key_and_the_expected_type(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text))


def test_constructor_argument_types_are_checked_against_annotations(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Linear', in_features = '784', out_features = 2}]"))
    with pytest.raises(ConfigError, match=r"layers\[0\] \(Linear\): 'in_features' must be an integer; got '784'"):
        config.build_model()
    config = tiny(tmp_path, "[optimizer]\ntype = 'SGD'\nlr = 'fast'")
    with pytest.raises(ConfigError, match=r"\[optimizer\] \(SGD\): 'lr' must be a number; got 'fast'"):
        config.build_trainer(config.build_model())


def test_missing_required_constructor_key_is_named(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Linear', in_features = 4}]"))
    with pytest.raises(ConfigError, match=r"missing required key\(s\) 'out_features'"):
        config.build_model()


def test_unknown_op_type_lists_the_available_ops(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Lineer'}]"))
    with pytest.raises(ConfigError, match=r"\[model\] layers\[0\]: unknown op 'Lineer'; available: .*Linear"):
        config.build_model()


def test_op_types_match_ignoring_case(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'linear', in_features = 2, out_features = 2}, {type = 'relu'}]"))
    assert [type(layer).__name__ for layer in config.build_model()] == ["Linear", "ReLU"]


def test_known_but_missing_op_names_the_distribution_to_install(tmp_path, monkeypatch):
    # A name no installed distribution provides, so the test holds whether or not vision is installed.
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_ops"], "Conv9d", "neuroflow-ops-vision")
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Conv9d', in_channels = 1}]"))
    with pytest.raises(ConfigError, match=r"op 'Conv9d' is not installed; it comes with: pip install neuroflow-ops-vision"):
        config.build_model()


def test_unknown_optimizer_loss_and_scheduler_types_list_alternatives(tmp_path):
    for table, bad, listed in (("optimizer", "Adamm", "SGD, Adam, AdamW"), ("loss", "Hinge", "CrossEntropy"),
                               ("scheduler", "Linear", "Constant")):
        config = tiny(tmp_path, f"[{table}]\ntype = '{bad}'")
        with pytest.raises(UnknownNameError, match=rf"unknown \[{table}\] type '{bad}'; available: .*{listed}"):
            config.build_trainer(config.build_model())


def test_loss_optimizer_and_scheduler_get_their_keys(tmp_path):
    config = tiny(tmp_path, "[loss]\ntype = 'CrossEntropy'\nlabel_smoothing = 0.1\n"
                            "[optimizer]\ntype = 'sgd'\nlr = 0.5\nmomentum = 0.9\n"
                            "[scheduler]\ntype = 'Step'\nstep_size = 2\ngamma = 0.5")
    trainer = config.build_trainer(config.build_model())
    assert trainer.loss.label_smoothing == pytest.approx(0.1)
    assert (type(trainer.optimizer).__name__, trainer.optimizer.lr, trainer.optimizer.momentum) == ("SGD", 0.5, 0.9)
    assert type(trainer.scheduler).__name__ == "Step"


def test_constructor_errors_become_config_errors_naming_the_table(tmp_path):
    config = tiny(tmp_path, "[optimizer]\ntype = 'AdamW'\nlr = -1")
    with pytest.raises(ConfigError, match=r"\[optimizer\] \(AdamW\): .*lr"):
        config.build_trainer(config.build_model())


def test_trainer_keys_reach_the_trainer(tmp_path):
    config = tiny(tmp_path, "").with_overrides(batch_size=5, device="cpu", epochs=3)
    trainer = config.build_trainer(config.build_model())
    assert (trainer.batch_size, trainer.backend.name, trainer.seed, config.epochs) == (5, "cpu", 3, 3)
    with pytest.raises(ConfigError, match="'batch_size' must be an integer"):
        config.with_overrides(batch_size="5")


def test_the_config_keys_are_the_trainer_options_a_file_can_hold(tmp_path):
    """One dataclass for the Trainer's keywords, the config's top level and the command line: a config's keys
    reach the Trainer as the TrainerOptions it would build from the same keywords."""
    from neuroflow.trainer import TrainerOptions

    in_file = {f.name for f in dataclasses.fields(TrainerOptions)} - {"progress", "augment"}
    assert set(TRAINER_KEYS) == in_file | {"epochs", "validate"}
    text = TINY.replace("batch_size = 16", "memory_budget_mb = 512\nenable_async_unload = true").format(extra="")
    config = load_config(write(tmp_path, text))
    trainer = config.build_trainer(config.build_model())
    assert trainer.options == TrainerOptions(**config.trainer)
    assert (trainer.options.memory_budget_mb, trainer.options.enable_async_unload) == (512, True)
    with pytest.raises(ConfigError, match=r"'batch_size' must be an integer; got 2.5"):
        config.with_overrides(batch_size=2.5)


def test_npz_data_is_read_relative_to_the_config_and_cast_to_float32(tmp_path):
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data" / "train.npz", x=rng.standard_normal((10, 6)), y=rng.integers(0, 3, 10))
    np.savez(tmp_path / "data" / "test.npz", x=rng.standard_normal((4, 6)), y=rng.integers(0, 3, 4))
    config = tiny(tmp_path, "[data]\ntrain = 'data/train.npz'\ntest = 'data/test.npz'")
    train, test = config.build_data()
    assert (len(train), len(test), train.x.dtype) == (10, 4, np.float32)
    only_train = tiny(tmp_path, "[data]\ntrain = 'data/train.npz'")
    assert only_train.build_data()[1] is None


def test_npz_problems_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"\[data\] train: file '.*missing.npz' not found"):
        tiny(tmp_path, "[data]\ntrain = 'missing.npz'").build_data()
    np.savez(tmp_path / "bad.npz", inputs=np.zeros((2, 6)))
    with pytest.raises(ConfigError, match=r"must hold arrays 'x' and 'y'; it has: inputs"):
        tiny(tmp_path, "[data]\ntrain = 'bad.npz'").build_data()
    with pytest.raises(ConfigError, match=r"no \[data\] table"):
        tiny(tmp_path).build_data()


@pytest.mark.parametrize(("data", "expected"), [
    ("dataset = 'cifar'", r"\[data\] dataset: unknown dataset 'cifar'; available: (.*, )?fashion_mnist, mnist"),
    ("dataset = 'mnist'\ntrain = 'a.npz'", r"exactly one of dataset"),
    ("train = 'a.npz'\nflat = true", r"unknown key 'flat' in \[data\] with train = .*; valid keys: train, test "
                                     r"\(the others go with dataset = "),
])
def test_inconsistent_data_tables_are_refused(tmp_path, data, expected):
    with pytest.raises(ConfigError, match=expected):
        tiny(tmp_path, f"[data]\n{data}")


def test_model_table_needs_exactly_one_of_name_and_layers(tmp_path):
    for text in ("[model]\n", "[model]\nname = 'x'\nlayers = [{type = 'ReLU'}]"):
        with pytest.raises(ConfigError, match="exactly one of name"):
            load_config(write(tmp_path, text))
    with pytest.raises(ConfigError, match=r"no \[model\] table"):
        load_config(write(tmp_path, "epochs = 1"))


def test_registered_model_builder_gets_its_keys(tmp_path, monkeypatch):
    from neuroflow import ops
    from neuroflow.composites import Sequential

    def tiny_mlp(width: int = 4, classes: int = 2) -> Sequential:
        return Sequential(ops.Linear(3, width), ops.ReLU(), ops.Linear(width, classes))

    registry.models.register("tiny_mlp", tiny_mlp)
    try:
        model = load_config(write(tmp_path, "[model]\nname = 'tiny_mlp'\nwidth = 7")).build_model()
        assert repr(model[0]) == "Linear(3→7)"
        with pytest.raises(ConfigError, match=r"unknown key 'depth' in \[model\] \(tiny_mlp\); valid keys: type, width, classes"):
            load_config(write(tmp_path, "[model]\nname = 'tiny_mlp'\ndepth = 7")).build_model()
        assert resolve_model_config("tiny_mlp").model == {"name": "tiny_mlp"}
    finally:
        registry.models.unregister("tiny_mlp")
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_models"], "resnet99", "neuroflow-ops-vision")
    with pytest.raises(ConfigError, match=r"\[model\] name: model 'resnet99' is not installed; .*neuroflow-ops-vision"):
        load_config(write(tmp_path, "[model]\nname = 'resnet99'")).build_model()
    with pytest.raises(UnknownNameError, match="resnet99.*pip install neuroflow-ops-vision"):
        resolve_model_config("resnet99")


def test_unreadable_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope.toml' not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(write(tmp_path, "epochs = = 2"))


def test_reshape_target_is_given_as_an_array_or_a_number(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Reshape', shape = [2, 3]}, {type = 'Flatten'}]"))
    model = config.build_model()
    assert model[0].shape == (2, 3)
    assert model.forward(np.zeros((4, 6), np.float32)).shape == (4, 6)
    flat = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Reshape', shape = 6}]")).build_model()
    assert flat.forward(np.zeros((4, 2, 3), np.float32)).shape == (4, 6)


# ---------------------------------------------------------------- new tables and keys
@pytest.mark.parametrize(("text", "expected"), [
    ("[model]\nname = 'x'\n[lora]\nranks = 4", r"unknown key 'ranks' in \[lora\]; valid keys: rank, alpha, dropout, targets"),
    ("[model]\nfrom = 'a.safetensors'\nwidth = 3",
     r"unknown key 'width' in \[model\]; valid keys: name, layers, from, input_shape"),
    ("[model]\nname = 'x'\n[data]\ndataset = 'sunspots'\nwindow = 4\nwindw = 5",
     r"unknown key 'windw' in \[data\]; valid keys: dataset, window, horizon, split"),
    ("checkpoint_dirs = 'c'\n[model]\nname = 'x'",
     r"unknown key 'checkpoint_dirs' at the top level; valid keys: .*checkpoint_dir, checkpoint_every, "
     r"keep_checkpoints, lora_fusion, .*\[lora\]"),
    ("[model]\nname = 'x'\n[output]\nsave = 'a'\nfused = true", r"unknown key 'fused' in \[output\]; valid keys: save, fuse, quantize"),
])
def test_unknown_new_keys_name_the_key_the_table_and_the_valid_keys(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(("text", "expected"), [
    ("[model]\nname = 'x'\n[lora]\nrank = '8'", r"\[lora\]: 'rank' must be an integer; got '8'"),
    ("[model]\nname = 'x'\n[lora]\nalpha = 'big'", r"\[lora\]: 'alpha' must be a number"),
    ("[model]\nname = 'x'\n[lora]\ntargets = 'Linear'", r"\[lora\]: 'targets' must be an array; got 'Linear'"),
    ("[model]\nname = 'x'\n[lora]\ntargets = []", r"\[lora\] 'targets' must be a non-empty array of op type names"),
    ("[model]\nname = 'x'\n[lora]\ntargets = [4]", r"\[lora\] 'targets' must be a non-empty array .*got \[4\]"),
    ("[model]\nfrom = 3", r"\[model\]: 'from' must be a string; got 3"),
    ("[model]\nname = 'x'\n[output]\nsave = 'a'\nfuse = 1", r"\[output\]: 'fuse' must be true or false; got 1"),
    ("[model]\nname = 'x'\n[data]\ndataset = 'sunspots'\nwindow = 16.5", r"\[data\]: 'window' must be an integer"),
    ("[model]\nname = 'x'\n[data]\ndataset = 'sunspots'\nwindow = 8\nsplit = '80%'", r"\[data\]: 'split' must be a number"),
    ("checkpoint_every = '10'\n[model]\nname = 'x'", r"'checkpoint_every' must be an integer; got '10'"),
    ("lora_fusion = 1\n[model]\nname = 'x'", r"'lora_fusion' must be true or false; got 1"),
])
def test_new_keys_have_their_types_checked(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(("data", "expected"), [
    ("dataset = 'sunspots'", r"\[data\]: missing required key\(s\) 'window'"),
    ("dataset = 'sunspots'\nwindow = 8\nnormalize = true",
     r"unknown key 'normalize' in \[data\]; valid keys: dataset, window, horizon, split"),
    ("dataset = 'mnist'\nwindow = 8\nsplit = 0.5", r"unknown key 'window' in \[data\]; valid keys: dataset, path, flat"),
    ("train = 'a.npz'\nhorizon = 2", r"unknown key 'horizon' in \[data\] with train = "),
    ("dataset = 'sunspots'\nwindow = 0", r"'window' must be a positive integer; got 0"),
    ("dataset = 'sunspots'\nwindow = 8\nhorizon = 0", r"'horizon' must be a positive integer; got 0"),
    ("dataset = 'sunspots'\nwindow = 8\nsplit = 1", r"'split' is the fraction of windows to train on, between 0 and 1; got 1"),
])
def test_series_data_keys_are_checked(tmp_path, data, expected):
    with pytest.raises(ConfigError, match=expected):
        tiny(tmp_path, f"[data]\n{data}")


def sunspot_config(tmp_path: Path, data: str = "") -> Config:
    return load_config(write(tmp_path, f"[model]\nlayers = [{{type = 'Flatten'}}]\n[data]\ndataset = 'sunspots'\n{data}"))


def test_sunspots_are_time_ordered_windows_standardised_by_the_training_part(tmp_path):
    from neuroflow_ops_recurrent.data import sunspots

    _, values = sunspots()
    config = sunspot_config(tmp_path, "window = 16")
    train, test = config.build_data()
    pairs = len(values) - 16
    assert (len(train), len(test)) == (int(0.8 * pairs), pairs - int(0.8 * pairs))
    assert train.x.shape == (len(train), 16, 1) and train.y.shape == (len(train), 1) and train.x.dtype == np.float32
    seen = values[:len(train) + 16]  # every value a training pair reads or predicts, and no later one
    assert (test.mean, test.std) == (train.mean, train.std) == pytest.approx((seen.mean(), seen.std()))
    original = np.concatenate([train.y, test.y])[:, 0] * train.std + train.mean
    np.testing.assert_allclose(original, values[16:], rtol=1e-5, atol=1e-3)  # no shuffling across the split
    np.testing.assert_allclose(test.x[0, :, 0] * test.std + test.mean, values[len(train):len(train) + 16], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(test.persistence(), test.x[:, -1])
    assert type(config.build_loss()).__name__ == "MSE"


def test_sunspots_horizon_and_split_choose_the_target_and_the_boundary(tmp_path):
    from neuroflow_ops_recurrent.data import sunspots

    _, values = sunspots()
    train, test = sunspot_config(tmp_path, "window = 8\nhorizon = 3\nsplit = 0.5").build_data()
    pairs = len(values) - 8 - 3 + 1
    assert (len(train), len(test)) == (pairs // 2, pairs - pairs // 2)
    # window i covers values[i:i+8] and forecasts values[i+8+2]
    np.testing.assert_allclose(train.x[5, :, 0] * train.std + train.mean, values[5:13], rtol=1e-5, atol=1e-4)
    assert float(train.y[5, 0] * train.std + train.mean) == pytest.approx(values[15], rel=1e-5)
    assert float(test.y[-1, 0] * test.std + test.mean) == pytest.approx(values[-1], rel=1e-5)
    with pytest.raises(ConfigError, match=r"window = 400, horizon = 1 and split = 0.8 leave 0 training and 0 held-out"):
        sunspot_config(tmp_path, "window = 400").build_data()


@pytest.fixture
def datasets_without_sunspots(monkeypatch):
    """Entry-point discovery as if neuroflow-ops-recurrent were not installed; the registry reset around it."""
    from importlib import metadata

    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points", lambda group=None, **kw: [
        ep for ep in real(group=group, **kw) if not (group == "neuroflow_datasets" and ep.name == "sunspots")])
    registry.datasets.reset()
    yield
    monkeypatch.undo()
    registry.datasets.reset()


def test_sunspots_without_the_recurrent_package_says_what_to_install(tmp_path, datasets_without_sunspots):
    with pytest.raises(ConfigError, match=r"\[data\] dataset: dataset 'sunspots' is not installed; it comes with: "
                                          r"pip install neuroflow-ops-recurrent \(available: (.*, )?fashion_mnist, mnist\)"):
        sunspot_config(tmp_path, "window = 4")


def test_a_dataset_plugin_that_fails_to_import_is_named(tmp_path, monkeypatch):
    import sys

    registry.datasets.reset()
    monkeypatch.setitem(sys.modules, "neuroflow_ops_recurrent.data.datasets", None)  # its import fails
    try:
        with pytest.raises(ConfigError, match=r"dataset 'sunspots' from neuroflow-ops-recurrent failed to load"):
            sunspot_config(tmp_path, "window = 4")
    finally:
        monkeypatch.undo()
        registry.datasets.reset()


class Ramp:
    """A third party's data set: its keys are its constructor's, a path is taken relative to the config."""

    loss = "MSE"

    def __init__(self, *, root: str | os.PathLike[str], length: int = 4) -> None:
        if length < 2:
            raise ValueError(f"'length' must be at least 2; got {length}")
        self.root, self.length = root, length

    def load(self):
        x = np.arange(self.length, dtype=np.float32)[:, None]
        scale = float(Path(self.root, "scale.txt").read_text())
        return ArrayDataset(x, scale * x), None


@pytest.fixture
def ramp():
    registry.datasets.register("ramp", Ramp)
    yield
    registry.datasets.unregister("ramp")


def test_a_registered_dataset_gets_its_keys_checked_its_paths_resolved_and_its_loss(tmp_path, ramp):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "scale.txt").write_text("2")
    config = tiny(tmp_path, "[data]\ndataset = 'ramp'\nroot = 'data'\nlength = 6")
    train, test = config.build_data()  # found from any working directory: root is taken from the config's
    np.testing.assert_array_equal(train.y[:, 0], 2 * np.arange(6))
    assert test is None
    assert type(config.build_loss()).__name__ == "MSE"
    assert type(tiny(tmp_path, "[data]\ndataset = 'ramp'\nroot = 'data'\n[loss]\ntype = 'CrossEntropy'")
                .build_loss()).__name__ == "CrossEntropy"
    for data, expected in [("root = 3", r"\[data\]: 'root' must be a string; got 3"),
                           ("root = 'd'\nlength = 1", r"\[data\]: 'length' must be at least 2; got 1"),
                           ("length = 3", r"\[data\]: missing required key\(s\) 'root'"),
                           ("root = 'd'\nsize = 3", r"unknown key 'size' in \[data\]; valid keys: dataset, root, length")]:
        with pytest.raises(ConfigError, match=expected):
            tiny(tmp_path, f"[data]\ndataset = 'ramp'\n{data}")


def test_image_datasets_leave_the_loss_to_the_trainer(tmp_path):
    assert tiny(tmp_path, "[data]\ndataset = 'mnist'").build_loss() is None


def test_the_mnist_path_is_taken_from_the_config_directory(tmp_path):
    from neuroflow.config.schema import dataset_source

    config = tiny(tmp_path, "[data]\ndataset = 'mnist'\npath = 'digits'\nflat = false")
    source = dataset_source(config.data, config.path)
    assert (source.path, source.flat, source.normalize) == (str(tmp_path / "digits"), False, False)


def save_tiny(tmp_path: Path, name: str = "base.safetensors") -> tuple[Path, object]:
    import neuroflow as nf

    model = tiny(tmp_path).build_model()
    path = tmp_path / name
    nf.save(model, path)
    return path, model


def test_model_from_loads_a_saved_model_relative_to_the_config(tmp_path):
    _, saved = save_tiny(tmp_path)
    config = load_config(write(tmp_path, "[model]\nfrom = 'base.safetensors'\ninput_shape = [6]"))
    model = config.build_model()
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(model.forward(x), saved.forward(x))
    assert config.input_shape == (6,)


def test_model_from_is_exclusive_and_a_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(ConfigError, match=r"exactly one of name .* and from = .*; got layers, from"):
        load_config(write(tmp_path, "[model]\nlayers = [{type = 'ReLU'}]\nfrom = 'a.safetensors'"))
    config = load_config(write(tmp_path, "[model]\nfrom = 'nothing.safetensors'"))
    with pytest.raises(ConfigError, match=r"\[model\] from: file '.*nothing.safetensors' not found; .*--save PATH"):
        config.build_model()


LORA = "[lora]\nrank = 2\nalpha = 4\ntargets = ['Linear']\n"


def test_lora_table_puts_adapters_on_a_loaded_model_and_lora_fusion_reaches_the_trainer(tmp_path):
    from neuroflow.lora import LoRALinear

    save_tiny(tmp_path)
    config = load_config(write(tmp_path, "lora_fusion = true\nseed = 1\n[model]\nfrom = 'base.safetensors'\n" + LORA))
    model = config.build_model()
    adapters = [op for op in model.modules() if isinstance(op, LoRALinear)]
    assert [(a.rank, a.alpha) for a in adapters] == [(2, 4.0), (2, 4.0)]
    # the seed makes the adapters' initialisation reproducible
    again = load_config(write(tmp_path, "seed = 1\n[model]\nfrom = 'base.safetensors'\n" + LORA)).build_model()
    np.testing.assert_array_equal(adapters[0].lora_A.data, next(op for op in again.modules()
                                                                 if isinstance(op, LoRALinear)).lora_A.data)
    trainer = config.build_trainer(model)
    assert trainer.options.lora_fusion is True
    trainer.train_step(np.ones((3, 6), np.float32), np.array([0, 1, 2]))
    trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    assert trainable == ["0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"]


@pytest.mark.parametrize(("lora", "expected"), [
    ("[lora]\nrank = 0", r"\[lora\]: LoRA rank must be a positive integer; got 0"),
    ("[lora]\ntargets = ['Conv2d7']", r"\[lora\]: LoRA target 'Conv2d7' is neither a layer path nor an op type"),
    ("[lora]\ntargets = ['1']", r"\[lora\]: layer 1 \(ReLU\(\)\) cannot take a LoRA adapter"),
])
def test_lora_errors_are_config_errors_naming_the_table(tmp_path, lora, expected):
    with pytest.raises(ConfigError, match=expected):
        tiny(tmp_path, lora).build_model()


@pytest.mark.parametrize(("text", "expected"), [
    ("[output]\nfuse = true", r"\[output\] 'fuse' and 'quantize' go with save = "),
    ("[output]\nsave = 'a.safetensors'\nfuse = true", r"\[output\] fuse = true need LoRA adapters, and the model has none"),
    ("[output]\nsave = 'a.safetensors'\nquantize = 'int8'\n" + LORA,
     r"\[output\] quantize = 'int8' needs fuse = true: the model has LoRA adapters"),
])
def test_fuse_and_quantize_are_checked_against_the_models_adapters(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        tiny(tmp_path, text).build_model()


def test_lora_fusion_without_adapters_is_refused_before_training(tmp_path):
    text = TINY.replace("batch_size = 16", "lora_fusion = true").format(extra="")
    with pytest.raises(ConfigError, match=r"lora_fusion = true need LoRA adapters, and the model has none; add a \[lora\]"):
        load_config(write(tmp_path, text)).build_model()
    fused = tiny(tmp_path, "[output]\nsave = 'a.safetensors'\nfuse = true\nquantize = 'int8'\n" + LORA)
    assert fused.build_model() is not None  # quantizing after fusing is allowed


def test_checkpoint_keys_reach_the_trainer_with_the_directory_relative_to_the_config(tmp_path):
    text = TINY.replace("batch_size = 16", "checkpoint_dir = 'ckpt'\ncheckpoint_every = 5\nkeep_checkpoints = 2")
    config = load_config(write(tmp_path, text.format(extra="")))
    trainer = config.build_trainer(config.build_model())
    assert (Path(trainer.checkpoint_dir), trainer.options.checkpoint_every, trainer.options.keep_checkpoints) == (tmp_path / "ckpt", 5, 2)
    config = load_config(write(tmp_path, TINY.replace("batch_size = 16", "checkpoint_every = 5").format(extra="")))
    with pytest.raises(ConfigError, match="checkpoint_every needs checkpoint_dir"):
        config.build_trainer(config.build_model())
