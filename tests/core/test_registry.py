"""Registries and plugins: discovery through entry points, lazy loading, failures, helpful errors."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from neuroflow import registry
from neuroflow.errors import PluginLoadError, UnknownNameError
from neuroflow.plugins import plugin_manager, reset_plugin_manager


class FakeDist:
    def __init__(self, name):
        self.name = name


def _entry_point(name, value, group, dist):
    ep = metadata.EntryPoint(name, value, group)
    return ep._for(FakeDist(dist)) if hasattr(ep, "_for") else ep


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Replace entry-point discovery with a given list, and reset registries around the test."""
    real = metadata.entry_points

    def install(extra):
        def entry_points(group=None, **kw):
            found = list(real(group=group, **kw))
            return found + [ep for ep in extra if ep.group == group]

        monkeypatch.setattr(metadata, "entry_points", entry_points)
        for reg in registry.ALL:
            reg.reset()
        reset_plugin_manager()

    yield install
    for reg in registry.ALL:
        reg.reset()
    reset_plugin_manager()


def test_core_registers_its_own_backend_ops_and_allocator_through_entry_points():
    assert "cpu" in registry.backends.names()
    assert registry.backends.distribution("cpu") == "neuroflow-core"
    assert {"Linear", "ReLU", "Dropout", "Sequential"} <= set(registry.ops.names())
    assert "direct" in registry.allocators.names()


def test_unknown_backend_lists_available_and_provider():
    from neuroflow.backends import get_backend

    with pytest.raises(UnknownNameError) as info:
        get_backend("cdua")
    assert "unknown backend 'cdua'; available: cpu" in str(info.value)
    if "cuda" not in registry.backends.names():
        with pytest.raises(UnknownNameError, match=r"it comes with: pip install neuroflow-cuda"):
            get_backend("cuda:0")


def test_missing_plugin_op_names_its_distribution(monkeypatch):
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_ops"], "FancyConv", "neuroflow-ops-fancy")
    from neuroflow import ops

    with pytest.raises(AttributeError, match="pip install neuroflow-ops-fancy"):
        ops.FancyConv  # noqa: B018


def test_broken_plugin_is_reported_and_skipped(fake_entry_points, capsys):
    fake_entry_points([
        _entry_point("broken", "neuroflow_no_such_module:plugin", "neuroflow_plugins", "broken-dist"),
        _entry_point("BrokenOp", "neuroflow_no_such_module:Op", "neuroflow_ops", "broken-dist"),
    ])
    manager = plugin_manager()
    assert "broken" not in [name for name, _ in manager.list_name_plugin()]
    assert "skipping plugin 'broken'" in capsys.readouterr().err
    with pytest.raises(PluginLoadError, match="from broken-dist failed to load: ModuleNotFoundError"):
        registry.ops.get("BrokenOp")
    assert "BrokenOp" in registry.ops.failures
    assert "Linear" in registry.ops.load_all()


def test_autoload_can_be_disabled(fake_entry_points, monkeypatch):
    monkeypatch.setenv("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD", "1")
    fake_entry_points([_entry_point("ThirdParty", "json:dumps", "neuroflow_ops", "someone-else")])
    assert "ThirdParty" not in registry.ops.names()
    assert "Linear" in registry.ops.names()
    monkeypatch.delenv("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD")
    registry.ops.reset()
    assert "ThirdParty" in registry.ops.names()


def test_hooks_are_called_by_the_trainer_lifecycle(fake_entry_points):
    import numpy as np

    import neuroflow as nf
    from neuroflow import ops
    from neuroflow.hookspecs import hookimpl

    calls = []

    class Recorder:
        @hookimpl
        def neuroflow_train_start(self, trainer):
            calls.append("start")

        @hookimpl
        def neuroflow_step_end(self, step):
            calls.append(f"step{step}")

        @hookimpl
        def neuroflow_epoch_end(self, epoch, metrics):
            calls.append(f"epoch{epoch}:{'loss' in metrics}")

        @hookimpl
        def neuroflow_train_end(self, history):
            calls.append(f"end{len(history)}")

    fake_entry_points([])
    plugin_manager().register(Recorder())
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    y = np.arange(8) % 2
    trainer = nf.Trainer(nf.Sequential(ops.Linear(3, 2)), batch_size=4, progress=False, seed=0)
    trainer.fit((x, y), epochs=2)
    assert calls == ["start", "step1", "step2", "epoch1:True", "step3", "step4", "epoch2:True", "end2"]


def test_import_is_lazy():
    code = "import sys, neuroflow; print(sorted(m for m in sys.modules if m.startswith(('neuroflow', 'numpy', 'pluggy'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['neuroflow', 'neuroflow.version']"


# ---------------------------------------------------------------- the one table of providers
def test_the_provider_table_agrees_with_the_installed_distributions():
    """KNOWN_PROVIDERS is the one declared table of which distribution provides a name; every entry point a
    plugin distribution of this repository installed here declares is in it, under that distribution (and
    nothing else is)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    plugins = {path.parent.name for path in root.glob("neuroflow-*/pyproject.toml")} - {registry.CORE_DISTRIBUTION}
    for group, table in registry.KNOWN_PROVIDERS.items():
        declared = {ep.name: ep.dist.name for ep in metadata.entry_points(group=group)
                    if ep.dist is not None and ep.dist.name in plugins}
        installed = {dist for dist in table.values() if _installed(dist)}
        assert declared == {name: dist for name, dist in table.items() if dist in installed}, group


def _installed(dist):
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_a_dataset_that_is_not_installed_names_its_distribution(monkeypatch):
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_datasets"], "cifar10", "neuroflow-ops-vision")
    with pytest.raises(UnknownNameError, match=r"dataset 'cifar10' is not installed; it comes with: pip install "
                                               r"neuroflow-ops-vision \(available: .*mnist"):
        registry.datasets.get("cifar10")


def test_datasets_and_onnx_converters_are_listed_by_neuroflow_plugins():
    assert {"mnist", "fashion_mnist"} <= set(registry.datasets.names())
    assert registry.datasets.distribution("mnist") == "neuroflow-core"
    assert {"Linear", "Sequential"} <= set(registry.onnx_converters.names())
    assert registry.datasets in registry.ALL and registry.onnx_converters in registry.ALL


# ---------------------------------------------------------------- fused-kernel declarations
def test_a_backend_registers_fused_kernels_against_their_declarations():
    from neuroflow.backends import kernels

    def linear(x, weight, bias, out):
        return out

    assert kernels.implementations("fake", {kernels.LINEAR: linear}) == {"linear": linear}
    assert str(kernels.ADAM_UPDATE).startswith("adam_update(data, grad, m, v, *, lr, beta1")


def test_an_undeclared_fused_kernel_is_refused_with_the_declared_ones():
    from neuroflow.backends import kernels

    fancy = kernels.FusedKernel("bias_activation", ("x", "bias", "out"), "out", "act(x + bias)")
    with pytest.raises(ValueError, match=r"backend 'fake' registers fused kernel 'bias_activation', which is not "
                                         r"declared in neuroflow.backends.kernels; declared: adam_update, sgd_update"):
        kernels.implementations("fake", {fancy: lambda x, bias, out: out})


def test_a_fused_kernel_with_other_parameters_is_refused_naming_the_declaration():
    import functools

    from neuroflow.backends import kernels

    def activation_backward(device, cached, g, gx, activation, slope=0.0, gbias=None):
        return gx

    with pytest.raises(ValueError, match=r"backend 'fake': its activation_backward takes \(cached, g, gx, activation, "
                                         r"slope, gbias\); the declaration is activation_backward\(cached, g, gx, "
                                         r"activation, slope\) -> gx"):
        kernels.implementations("fake", {kernels.ACTIVATION_BACKWARD: functools.partial(activation_backward, None)})


def test_optimizer_keywords_must_stay_keyword_only():
    from neuroflow.backends import kernels

    def sgd_update(data, grad, buf, lr, momentum, dampening, nesterov, weight_decay, first):
        return None

    with pytest.raises(ValueError, match=r"its sgd_update takes \(data, grad, buf, lr, "):
        kernels.implementations("fake", {kernels.SGD_UPDATE: sgd_update})


def test_every_fused_kernel_the_core_asks_for_is_declared():
    """The ops, losses and optimizers name kernels only through the declarations (no string spelled twice)."""
    import ast
    from pathlib import Path

    import neuroflow
    from neuroflow.backends import kernels

    asked = set()
    for path in Path(neuroflow.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fused":
                first = node.args[0] if node.args else None
                assert not isinstance(first, ast.Constant), f"{path}:{node.lineno} spells a kernel name"
                if isinstance(first, ast.Attribute) and first.attr == "name" and isinstance(first.value, ast.Attribute):
                    asked.add(first.value.attr)
    assert asked == {name.upper() for name in kernels.DECLARED}
