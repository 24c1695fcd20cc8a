"""TOML configs: validation of every key and type, and building model, trainer and data from them."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

import neuroflow.trainer
from neuroflow import registry
from neuroflow.config import TRAINER_KEYS, Config, load_config, resolve_model_config
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
     r"unknown key 'shufle' in \[data\]; valid keys: dataset, flat, normalize, path, train, test"),
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


class _TrainerWithoutMemoryRuntime:
    def __init__(self, model, loss=None, optimizer=None, scheduler=None, *, batch_size=64, seed=None):
        self.kwargs = {"batch_size": batch_size}


class _TrainerWithMemoryRuntime(_TrainerWithoutMemoryRuntime):
    def __init__(self, model, loss=None, optimizer=None, scheduler=None, *, batch_size=64, seed=None,
                 memory_budget_mb=None, memory_pool_size_mb=None, enable_async_unload=False):
        self.kwargs = {"memory_budget_mb": memory_budget_mb, "enable_async_unload": enable_async_unload}


def test_memory_runtime_keys_need_a_trainer_that_accepts_them(tmp_path, monkeypatch):
    assert {"memory_budget_mb", "memory_pool_size_mb", "enable_async_unload"} <= set(TRAINER_KEYS)
    text = TINY.replace("batch_size = 16", "memory_budget_mb = 512\nenable_async_unload = true").format(extra="")
    config = load_config(write(tmp_path, text))
    monkeypatch.setattr(neuroflow.trainer, "Trainer", _TrainerWithoutMemoryRuntime)
    with pytest.raises(ConfigError, match=r"'(memory_budget_mb|enable_async_unload)' requires the memory runtime"):
        config.build_trainer(config.build_model())
    monkeypatch.setattr(neuroflow.trainer, "Trainer", _TrainerWithMemoryRuntime)
    trainer = config.build_trainer(config.build_model())
    assert trainer.kwargs == {"memory_budget_mb": 512, "enable_async_unload": True}


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
    ("dataset = 'cifar'", r"dataset 'cifar' is unknown; valid: mnist, fashion_mnist"),
    ("dataset = 'mnist'\ntrain = 'a.npz'", r"exactly one of dataset"),
    ("train = 'a.npz'\nflat = true", r"'flat', 'normalize' and 'path' go with dataset"),
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


def test_memory_runtime_check_reads_the_real_trainer_signature(tmp_path):
    """Whichever Trainer is installed, memory keys either reach it or fail with the memory-runtime message."""
    text = TINY.replace("batch_size = 16", "memory_budget_mb = 4096").format(extra="")
    config = load_config(write(tmp_path, text))
    if "memory_budget_mb" in inspect.signature(neuroflow.trainer.Trainer).parameters:
        config.build_trainer(config.build_model())
    else:
        with pytest.raises(ConfigError, match="requires the memory runtime"):
            config.build_trainer(config.build_model())


def test_reshape_target_is_given_as_an_array_or_a_number(tmp_path):
    config = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Reshape', shape = [2, 3]}, {type = 'Flatten'}]"))
    model = config.build_model()
    assert model[0].shape == (2, 3)
    assert model.forward(np.zeros((4, 6), np.float32)).shape == (4, 6)
    flat = load_config(write(tmp_path, "[model]\nlayers = [{type = 'Reshape', shape = 6}]")).build_model()
    assert flat.forward(np.zeros((4, 2, 3), np.float32)).shape == (4, 6)
