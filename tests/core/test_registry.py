"""Registries and plugins: discovery through entry points, lazy loading, failures, helpful errors."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.errors import NonFiniteLossError, PluginHookError, PluginLoadError, PluginWarning, UnknownNameError
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager, reset_plugin_manager


class FakeDist:
    def __init__(self, name):
        self.name = name


def _entry_point(name, value, group, dist):
    ep = metadata.EntryPoint(name, value, group)
    return ep._for(FakeDist(dist)) if hasattr(ep, "_for") else ep


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Replace entry-point discovery with a given list, and reset registries around the test; ``first=True``
    lists them before the installed ones (discovery order is the environment's, not a promise)."""
    real = metadata.entry_points

    def install(extra, first=False):
        def entry_points(group=None, **kw):
            found = list(real(group=group, **kw))
            fakes = [ep for ep in extra if ep.group == group]
            return fakes + found if first else found + fakes

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


HOOKS = """
    from neuroflow.hookspecs import hookimpl

    ended = []

    @hookimpl
    def neuroflow_step_end(step):
        if {step_fails} and step == 2:
            raise ValueError("bad step")

    @hookimpl
    def neuroflow_train_end(history):
        ended.append(len(history))
        if {end_fails}:
            raise RuntimeError("cannot upload the run")
"""


def _fit(epochs=2, lr=0.1, x=None):
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32) if x is None else x
    trainer = nf.Trainer(nf.Sequential(ops.Linear(3, 2)), optimizer=nf.optim.SGD(lr=lr), batch_size=4,
                         progress=False, seed=0)
    return trainer, trainer.fit((x, np.arange(8) % 2), epochs=epochs)


def test_a_hook_that_raises_is_named_with_its_plugin_distribution_and_hook(fake_entry_points, plugin_module):
    module = plugin_module("nf_stepfails", HOOKS.format(step_fails=True, end_fails=False))
    fake_entry_points([_entry_point("stepper", module, "neuroflow_plugins", "stepper-dist")])
    with pytest.raises(PluginHookError, match=r"^plugin 'stepper' \(distribution stepper-dist\) raised in "
                                              r"neuroflow_step_end: ValueError: bad step; fix or uninstall "
                                              r"stepper-dist") as info:
        _fit()
    error = info.value
    assert (error.plugin, error.distribution, error.hook) == ("stepper", "stepper-dist", "neuroflow_step_end")
    assert isinstance(error.__cause__, ValueError) and error.error is error.__cause__
    assert sys.modules[module].ended == [0]  # train_end still told the plugin the run ended


def test_a_plugin_registered_at_run_time_is_named_by_its_class():
    class Exploding:
        @hookimpl
        def neuroflow_epoch_end(self, epoch):
            raise KeyError(epoch)

    plugin = Exploding()
    plugin_manager().register(plugin)
    try:
        with pytest.raises(PluginHookError, match=r"plugin 'Exploding' \(registered at run time\) raised in "
                                                  r"neuroflow_epoch_end: KeyError: 1; fix the plugin"):
            _fit()
    finally:
        plugin_manager().unregister(plugin)


def test_a_failing_train_end_after_training_keeps_the_history_and_is_warned(fake_entry_points, plugin_module):
    module = plugin_module("nf_endfails", HOOKS.format(step_fails=False, end_fails=True))
    fake_entry_points([_entry_point("uploader", module, "neuroflow_plugins", "uploader-dist")])
    with pytest.warns(PluginWarning, match=r"plugin 'uploader' \(distribution uploader-dist\) raised in "
                                           r"neuroflow_train_end: RuntimeError: cannot upload the run"):
        trainer, history = _fit(epochs=2)
    assert len(history) == 2 and trainer.history is history and trainer.step == 4
    [error] = history.hook_errors
    assert isinstance(error, PluginHookError) and isinstance(error.__cause__, RuntimeError)


def test_a_failing_train_end_does_not_hide_the_training_error(fake_entry_points, plugin_module):
    module = plugin_module("nf_endfails_too", HOOKS.format(step_fails=False, end_fails=True))
    fake_entry_points([_entry_point("uploader", module, "neuroflow_plugins", "uploader-dist")])
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    x[5, 0] = np.nan
    with pytest.warns(PluginWarning, match="raised in neuroflow_train_end"), \
            pytest.raises(NonFiniteLossError, match="loss became nan at step 2") as info:
        _fit(x=x)
    assert any("plugin 'uploader' (distribution uploader-dist) raised in neuroflow_train_end" in note
               for note in info.value.__notes__)
    assert sys.modules[module].ended == [0]


def test_a_distribution_cannot_take_a_name_another_provides(fake_entry_points):
    """The first provider keeps a name: the core, then the distribution the project declares for it, then the
    others by name; the rest are refused and warned about, and a broken one cannot break the name."""
    from neuroflow.ops.linear import Linear

    fakes = [_entry_point("Linear", "neuroflow_no_such_module:Linear", "neuroflow_ops", "aaa-shadow"),
             _entry_point("Gizmo", "json:dumps", "neuroflow_ops", "zzz-gizmos"),
             _entry_point("Gizmo", "json:loads", "neuroflow_ops", "mmm-gizmos"),
             _entry_point("Gizmo", "json:loads", "neuroflow_ops", "mmm-gizmos")]  # one distribution found twice
    fake_entry_points(fakes, first=True)  # listed before the core's own
    with pytest.warns(PluginWarning) as warned:
        names = registry.ops.names()
    assert {str(w.message) for w in warned} == {
        "op 'Linear' of aaa-shadow is refused: neuroflow-core already provides it (uninstall one; "
        "`neuroflow plugins` lists the conflicts)",
        "op 'Gizmo' of zzz-gizmos is refused: mmm-gizmos already provides it (uninstall one; "
        "`neuroflow plugins` lists the conflicts)"}
    assert "Linear" in names and ops.Linear is Linear and registry.ops.distribution("Linear") == "neuroflow-core"
    assert registry.ops.get("Gizmo") is __import__("json").loads
    assert registry.ops.conflicts == {"Linear": ["aaa-shadow"], "Gizmo": ["zzz-gizmos"]}
    assert registry.ops.failures == {}
    assert "Linear" in registry.ops.load_all()


def test_the_declared_provider_of_a_plugin_name_keeps_it(fake_entry_points):
    if registry.ops.distribution("Conv2d") != "neuroflow-ops-vision":
        pytest.skip("neuroflow-ops-vision is not installed")
    fake_entry_points([_entry_point("Conv2d", "json:dumps", "neuroflow_ops", "aaa-convs")], first=True)
    with pytest.warns(PluginWarning, match="op 'Conv2d' of aaa-convs is refused: neuroflow-ops-vision already"):
        assert registry.ops.distribution("Conv2d") == "neuroflow-ops-vision"


def test_sys_exit_at_plugin_import_is_contained_and_not_run_again(fake_entry_points, plugin_module, tmp_path):
    runs = tmp_path / "runs"
    module = plugin_module("nf_exits", f"""
        import sys
        with open({str(runs)!r}, "a") as f:
            f.write("x")
        sys.exit(3)
    """)
    fake_entry_points([_entry_point("exiter", module, "neuroflow_plugins", "exiter-dist"),
                       _entry_point("ExitOp", f"{module}:Op", "neuroflow_ops", "exiter-dist")])
    manager = plugin_manager()  # skips it instead of exiting
    assert "exiter" not in [name for name, _ in manager.list_name_plugin()]
    assert registry.plugins.failures == {"exiter": "SystemExit: 3"}
    for _ in range(2):
        with pytest.raises(PluginLoadError, match="op 'ExitOp' from exiter-dist failed to load: SystemExit: 3"):
            registry.ops.get("ExitOp")
    assert runs.read_text() == "xx"  # imported once for the plugin, once for the op; a failure is not re-run


def test_a_plugin_pluggy_refuses_is_recorded_and_skipped(fake_entry_points, plugin_module, capsys):
    module = plugin_module("nf_badargs", """
        from neuroflow.hookspecs import hookimpl

        @hookimpl
        def neuroflow_step_end(step, nonsense):
            pass
    """)
    fake_entry_points([_entry_point("badargs", module, "neuroflow_plugins", "badargs-dist")])
    manager = plugin_manager()
    assert "badargs" not in [name for name, _ in manager.list_name_plugin()]
    assert "nonsense" in registry.plugins.failures["badargs"]
    assert "skipping plugin 'badargs'" in capsys.readouterr().err


def test_import_is_lazy():
    code = "import sys, neuroflow; print(sorted(m for m in sys.modules if m.startswith(('neuroflow', 'numpy', 'pluggy'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['neuroflow', 'neuroflow.blas_idle', 'neuroflow.version']"  # no numpy, no pluggy


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
