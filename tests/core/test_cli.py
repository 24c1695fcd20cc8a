"""The ``neuroflow`` command line, run in-process through ``main(argv)``; one real subprocess for the script."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

import neuroflow
import neuroflow.cli.train
from neuroflow import ops, registry
from neuroflow.cli import main
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager, reset_plugin_manager

CONFIG = """
batch_size = 16
epochs = 1
seed = 0

[model]
layers = [
    {{ type = "Linear", in_features = 6, out_features = 8 }},
    {{ type = "ReLU" }},{middle}
    {{ type = "Linear", in_features = 8, out_features = 3 }},
]
{extra}
"""
DATA = "[data]\ntrain = 'train.npz'\ntest = 'test.npz'\n"


@pytest.fixture
def workdir(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("test", 16)):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        np.savez(tmp_path / f"{split}.npz", x=x, y=(x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1))
    return tmp_path


def config(directory: Path, extra: str = DATA, middle: str = "") -> str:
    path = directory / "config.toml"
    path.write_text(CONFIG.format(extra=extra, middle=middle))
    return str(path)


class BrokenTanh(ops.Tanh):
    """Tanh whose backward doubles the gradient: what the checks must catch."""

    def backward(self, grad_out):
        return 2 * super().backward(grad_out)

    @classmethod
    def gradcheck_example(cls):
        return cls(), [np.random.default_rng(0).standard_normal((3, 4))]


@pytest.fixture
def broken_op():
    registry.ops.register("BrokenTanh", BrokenTanh)
    yield "BrokenTanh"
    registry.ops.unregister("BrokenTanh")


class _Dist:
    def __init__(self, name):
        self.name = name


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Add entry points to discovery, with registries and the plugin manager reset around the test."""
    real = metadata.entry_points

    def install(*extra):
        eps = [metadata.EntryPoint(name, value, group)._for(_Dist(dist)) for name, value, group, dist in extra]
        monkeypatch.setattr(metadata, "entry_points",
                            lambda group=None, **kw: [*real(group=group, **kw), *(e for e in eps if e.group == group)])
        for reg in registry.ALL:
            reg.reset()
        reset_plugin_manager()

    yield install
    monkeypatch.undo()
    for reg in registry.ALL:
        reg.reset()
    reset_plugin_manager()


# ---------------------------------------------------------------- arguments and errors
def test_console_script_prints_help():
    script = Path(sys.executable).parent / "neuroflow"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for command in ("train", "plugins", "backends", "gradcheck", "debug-backward", "doctor"):
        assert command in result.stdout


@pytest.mark.parametrize("argv", [[], ["bogus"], ["train"], ["train", "a.toml", "--epochs", "zero"],
                                  ["train", "a.toml", "--batch-size", "0"], ["debug-backward"]])
def test_bad_arguments_exit_2_with_usage(argv, capsys):
    assert main(argv) == 2
    assert "usage: neuroflow" in capsys.readouterr().err


def test_bad_config_is_one_line_without_traceback(workdir, capsys, monkeypatch):
    path = workdir / "bad.toml"
    path.write_text("batchsize = 3\n[model]\nname = 'x'\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("neuroflow: error: unknown key 'batchsize' at the top level; valid keys: device, batch_size")
    monkeypatch.setenv("NEUROFLOW_TRACEBACK", "1")
    assert main(["train", str(path)]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_missing_config_file_and_unknown_op_exit_2(workdir, capsys):
    assert main(["train", str(workdir / "nope.toml")]) == 2
    assert "config file" in capsys.readouterr().err
    path = config(workdir, middle="\n    { type = 'Lineer' },")
    assert main(["train", path]) == 2
    assert "unknown op 'Lineer'; available: " in capsys.readouterr().err


# ---------------------------------------------------------------- train
def test_train_on_npz_prints_epochs_and_test_metrics(workdir, capsys):
    assert main(["train", config(workdir), "--epochs", "2", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "48 training and 16 test samples; device cpu:0, batch 16, 2 epoch(s)" in out
    assert "epoch 1/2" in err and "epoch 2/2" in err
    test_line = next(line for line in out.splitlines() if line.startswith("test: "))
    accuracy = float(test_line.split("accuracy ")[1])
    assert 0.0 <= accuracy <= 1.0


def test_train_batch_size_override_and_unknown_device(workdir, capsys):
    assert main(["train", config(workdir), "--batch-size", "48"]) == 0
    assert "batch 48" in capsys.readouterr().out
    assert main(["train", config(workdir), "--device", "cdua"]) == 2
    error = capsys.readouterr().err  # the available list names cpu among whatever else is registered
    assert "unknown backend 'cdua'; available: " in error and "cpu" in error.split("available: ")[1].strip().split(", ")


def test_output_save_calls_neuroflow_save_with_the_resolved_path(workdir, monkeypatch):
    saved = {}
    monkeypatch.setattr(neuroflow.cli.train, "save", lambda model, path, **kw: saved.update(model=model, path=path, **kw))
    assert main(["train", config(workdir, DATA + "[output]\nsave = 'out/m.safetensors'\nquantize = 'int8'\n")]) == 0
    assert saved["path"] == workdir / "out" / "m.safetensors" and saved["quantize"] == "int8"
    assert isinstance(saved["model"], neuroflow.Sequential)


def test_the_saved_model_loads_in_evaluation_mode(workdir):
    """The trained model is a finished one: nf.load gives it back ready to predict (BatchNorm and Dropout as in
    evaluation), not in the training mode fit left it in."""
    assert main(["train", config(workdir, DATA + "[output]\nsave = 'm.safetensors'\n")]) == 0
    assert neuroflow.load(workdir / "m.safetensors").training is False


# ---------------------------------------------------------------- plugins, backends, doctor
def test_plugins_lists_every_registry_with_distributions(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for section in ("backends [neuroflow_backends]", "ops [neuroflow_ops]", "allocators [neuroflow_allocators]",
                    "models [neuroflow_models]", "plugins [neuroflow_plugins]"):
        assert section in out
    cpu = next(line for line in out.splitlines() if line.split()[:1] == ["cpu"])
    assert "neuroflow-core" in cpu and "ok" in cpu and "available" in cpu


def test_failing_plugins_are_reported_and_skipped(fake_entry_points, capsys):
    fake_entry_points(("BrokenOp", "neuroflow_no_such_module:Op", "neuroflow_ops", "broken-dist"),
                      ("brokenbe", "neuroflow_no_such_module:Backend", "neuroflow_backends", "broken-dist"),
                      ("badhooks", "neuroflow_no_such_module:hooks", "neuroflow_plugins", "broken-dist"))
    assert main(["plugins"]) == 0
    out, err = capsys.readouterr()
    line = next(line for line in out.splitlines() if "BrokenOp" in line)
    assert "broken-dist" in line and "FAILED: ModuleNotFoundError" in line
    assert re.search(r"ops \[neuroflow_ops\] \(\d+ found, [1-9]\d* failed\)", out)
    assert "skipping plugin 'badhooks'" in err
    assert next(line for line in out.splitlines() if "Linear" in line).endswith("ok")
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "brokenbe" in out and "FAILED" in out and "ops [" not in out
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "brokenbe" in out and "BrokenOp" in out
    assert main(["gradcheck", "Linear"]) == 0  # the broken plugins do not stop other commands


def test_plugins_shows_a_plugin_whose_hook_raised_in_this_process_as_failed(fake_entry_points, plugin_module,
                                                                             capsys):
    module = plugin_module("nf_cli_stepfails", """
        from neuroflow.hookspecs import hookimpl

        @hookimpl
        def neuroflow_step_end(step):
            raise ValueError("bad step")
    """)
    fake_entry_points(("stepper", module, "neuroflow_plugins", "stepper-dist"))
    x = np.zeros((8, 6), dtype=np.float32)
    with pytest.raises(neuroflow.errors.PluginHookError, match="plugin 'stepper'"):
        neuroflow.Trainer(neuroflow.Sequential(ops.Linear(6, 2)), batch_size=4, progress=False).fit((x, np.zeros(8, int)))
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "plugins [neuroflow_plugins] (1 found, 1 failed)" in out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["stepper"])
    assert "stepper-dist" in row and row.endswith("FAILED in neuroflow_step_end: ValueError: bad step")


def test_plugins_shows_a_refused_name_and_who_keeps_it(fake_entry_points, capsys):
    fake_entry_points(("Linear", "neuroflow_no_such_module:Linear", "neuroflow_ops", "shadow-ops"))
    assert main(["plugins"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"ops \[neuroflow_ops\] \(\d+ found, 1 refused\)", out)
    rows = [line for line in out.splitlines() if line.split()[:1] == ["Linear"]]
    assert any("neuroflow-core" in row and row.endswith("ok") for row in rows)
    assert any("shadow-ops" in row and row.endswith("REFUSED: neuroflow-core already provides 'Linear'")
               for row in rows)
    assert "PluginWarning" not in err  # the table says it
    assert main(["gradcheck", "Linear"]) == 0  # the core's Linear, unbroken


def test_plugins_survives_a_plugin_that_calls_sys_exit_at_import(fake_entry_points, plugin_module, capsys):
    module = plugin_module("nf_cli_exits", "import sys\nsys.exit(3)\n")
    fake_entry_points(("exiter", module, "neuroflow_plugins", "exiter-dist"))
    assert main(["plugins"]) == 0
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.split()[:1] == ["exiter"])
    assert "exiter-dist" in row and row.endswith("FAILED: SystemExit: 3")
    assert "plugins [neuroflow_plugins] (1 found, 1 failed)" in out
    assert "skipping plugin 'exiter'" in err


def test_doctor_reports_versions_backends_and_data(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^  numpy +{re.escape(np.__version__)}$", out, re.M)  # the column widens with the settings shown
    assert re.search(rf"^  neuroflow +{re.escape(neuroflow.__version__)} ", out, re.M)
    assert "pluggy" in out and "cpu count" in out and "platform" in out
    assert re.search(r"^  numba +(\d+\.\d+|not installed)", out, re.M)  # the vision ops' compiled loops
    assert any(line.split()[:3] == ["cpu:0", "neuroflow-core", "0.1.0"] and "available" in line
               for line in out.splitlines())
    assert any(line.split()[:1] == ["mnist"] for line in out.splitlines())


def test_doctor_survives_a_plugin_whose_backend_probe_raises(capsys):
    class Exploding(neuroflow.backends.Backend):
        name = "exploding"

        @classmethod
        def is_available(cls):
            raise RuntimeError("driver crashed")

    registry.backends.register("exploding", Exploding)
    try:
        assert main(["doctor"]) == 0
        assert "FAILED: RuntimeError: driver crashed" in capsys.readouterr().out
    finally:
        registry.backends.unregister("exploding")


# ---------------------------------------------------------------- plugin commands
class HelloPlugin:
    @hookimpl
    def neuroflow_register_commands(self, register):
        def configure(parser):
            parser.add_argument("--name", default="world")

        def run(args):
            print(f"hello {args.name}")
            return 3

        register("hello", "say hello", configure, run)


class BrokenCommandsPlugin:
    @hookimpl
    def neuroflow_register_commands(self, register):
        raise RuntimeError("no commands today")


def test_plugins_add_commands_and_a_broken_one_is_skipped(capsys):
    reset_plugin_manager()
    manager = plugin_manager()
    manager.register(HelloPlugin(), name="hello-plugin")
    manager.register(BrokenCommandsPlugin(), name="broken-commands")
    try:
        assert main(["hello", "--name", "nf"]) == 3
        out, err = capsys.readouterr()
        assert out == "hello nf\n"
        assert "skipping commands of plugin 'broken-commands': RuntimeError: no commands today" in err
        assert main(["plugins"]) == 0  # in the same process: the plugin whose hook raised is not "ok"
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.split()[:1] == ["broken-commands"])
        assert row.endswith("(registered at run time)  FAILED in neuroflow_register_commands: RuntimeError: "
                            "no commands today")
        assert next(line for line in out.splitlines() if line.split()[:1] == ["hello-plugin"]).endswith("ok")
    finally:
        reset_plugin_manager()


# ---------------------------------------------------------------- gradcheck
def test_gradcheck_passes_every_core_op(capsys):
    assert main(["gradcheck"]) == 0
    out = capsys.readouterr().out
    for name in ("Linear", "ReLU", "LeakyReLU", "Sigmoid", "Tanh", "GELU", "Softmax", "Dropout", "Flatten",
                 "Reshape", "Add", "Sequential", "Residual", "Concat"):
        assert f"PASS  {name}\n" in out
    assert "0 failed" in out


def test_gradcheck_fails_a_broken_op(broken_op, capsys):
    assert main(["gradcheck", "linear", broken_op]) == 1
    out = capsys.readouterr().out
    assert "PASS  Linear" in out
    assert "FAIL  BrokenTanh: BrokenTanh(): gradient of input 0 at" in out and "finite differences give" in out


def test_gradcheck_unknown_op_or_op_without_example_exits_2(capsys):
    assert main(["gradcheck", "Nope"]) == 2
    assert re.search(r"unknown op 'Nope'; available: Add, .*Concat", capsys.readouterr().err)

    class NoExample(ops.ReLU):
        pass

    registry.ops.register("NoExample", NoExample)
    try:
        assert main(["gradcheck", "NoExample"]) == 2
        assert "has no gradcheck example" in capsys.readouterr().err
        assert main(["gradcheck"]) == 0
        assert "SKIP  NoExample: no gradcheck_example()" in capsys.readouterr().out
    finally:
        registry.ops.unregister("NoExample")


# ---------------------------------------------------------------- debug-backward
def test_debug_backward_prints_norms_and_finds_no_wrong_layer(workdir, capsys):
    assert main(["debug-backward", "--model", config(workdir), "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "the first 8 training samples" in out
    row = next(line for line in out.splitlines() if "Linear(6→8)" in line and "(8, 8)" in line)
    assert "weight " in row and "bias " in row
    assert "every checked layer's backward matches finite differences" in out


def test_debug_backward_names_the_first_broken_layer(workdir, broken_op, capsys):
    path = config(workdir, middle=f"\n    {{ type = '{broken_op}' }},")
    assert main(["debug-backward", "--model", path]) == 1
    out = capsys.readouterr().out
    assert "first layer whose backward is wrong: 2 BrokenTanh()" in out
    assert "  1  ReLU(): ok" in out


def test_debug_backward_layer_filter_and_random_data(workdir, capsys):
    path = config(workdir, extra="")  # no [data]: random inputs of the first layer's shape
    assert main(["debug-backward", "--model", path, "--layer", "LINEAR", "--batch-size", "5"]) == 0
    out = capsys.readouterr().out
    assert "random data of shape (5, 6)" in out
    table = out.split("finite-difference")[0]
    assert "Linear(6→8)" in table and "Linear(8→3)" in table and "ReLU" not in table
    assert main(["debug-backward", "--model", path, "--layer", "conv2d"]) == 2
    assert "no layer of type 'conv2d' in the model; its layer types: Linear, ReLU" in capsys.readouterr().err


# ---------------------------------------------------------------- train: resume, --save, LoRA
def test_resume_needs_checkpoint_dir_in_the_config(workdir, capsys):
    assert main(["train", config(workdir), "--resume"]) == 2
    assert "--resume needs checkpoint_dir = \"...\" in the config" in capsys.readouterr().err


def test_resume_finishes_the_run_from_the_newest_checkpoint(workdir, capsys):
    path = Path(config(workdir))
    path.write_text("checkpoint_dir = 'ckpt'\ncheckpoint_every = 1\nkeep_checkpoints = 2\n" + path.read_text())
    assert main(["train", str(path), "--resume"]) == 1  # nothing written yet
    assert str(workdir / "ckpt") in capsys.readouterr().err
    assert main(["train", str(path), "--epochs", "1"]) == 0  # 48 samples in batches of 16: steps 1-3
    assert sorted(p.name for p in (workdir / "ckpt").iterdir()) == ["ckpt-00000002.safetensors",
                                                                    "ckpt-00000003.safetensors"]
    capsys.readouterr()
    assert main(["train", str(path), "--epochs", "2", "--resume"]) == 0
    out, err = capsys.readouterr()
    assert f"resumed from {workdir / 'ckpt' / 'ckpt-00000003.safetensors'} at step 3 (epoch 1)" in out
    assert "epoch 2/2" in err and "epoch 1/2" not in err
    assert (workdir / "ckpt" / "ckpt-00000006.safetensors").is_file()


def test_save_flag_overrides_output_save_and_is_relative_to_the_current_directory(workdir, monkeypatch):
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = config(workdir, DATA + "[output]\nsave = 'from_config.safetensors'\n")
    assert main(["train", path, "--save", "out/model.safetensors"]) == 0
    assert not (workdir / "from_config.safetensors").exists()
    assert [repr(op) for op in neuroflow.load(elsewhere / "out" / "model.safetensors")][0] == "Linear(6→8)"


def test_lora_config_fine_tunes_a_saved_model_then_fuses_and_saves_a_plain_one(workdir, capsys):
    assert main(["train", config(workdir), "--save", str(workdir / "base.safetensors")]) == 0
    lora = workdir / "lora.toml"
    lora.write_text("epochs = 2\nbatch_size = 16\nseed = 0\nlora_fusion = true\n"
                    "[model]\nfrom = 'base.safetensors'\n[lora]\nrank = 2\nalpha = 4\ntargets = ['Linear']\n"
                    f"{DATA}[output]\nsave = 'fused.safetensors'\nfuse = true\n")
    capsys.readouterr()
    assert main(["train", str(lora)]) == 0
    out = capsys.readouterr().out
    assert "LoRALinear(Linear(6→8), rank=2, alpha=4)" in out and "fused the LoRA adapters into the base weights" in out
    base = dict(neuroflow.load(workdir / "base.safetensors").named_parameters())
    fused = dict(neuroflow.load(workdir / "fused.safetensors").named_parameters())
    assert list(fused) == list(base) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name in ("0.bias", "2.bias"):  # lora_fusion: only the adapters trained
        np.testing.assert_array_equal(fused[name].data, base[name].data)
    assert not np.allclose(fused["0.weight"].data, base["0.weight"].data)


def test_bench_times_each_backend_and_says_what_auto_would_choose(capsys):
    assert main(["bench", "--backend", "cpu", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["cpu"])
    assert float(row.split()[1]) > 0 and "ms/step" in row and "1.00× cpu" in row
    assert main(["bench", "--backend", "nosuch"]) == 2
    assert "unknown backend 'nosuch'" in capsys.readouterr().err
    assert main(["bench", "--steps", "0"]) == 2


def test_a_closed_pipe_is_not_an_error(monkeypatch):
    def closed(args):
        raise BrokenPipeError
    from neuroflow.cli import plugins

    monkeypatch.setattr(plugins, "run", closed)
    assert main(["plugins"]) == 0
