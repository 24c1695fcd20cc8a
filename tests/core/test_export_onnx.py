"""ONNX export: every exported graph passes onnx.checker and onnxruntime computes what ``model.eval().forward`` does."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.cli import main
from neuroflow.export import ExportError, Value, register_converter, supported_ops, to_onnx
from neuroflow.operator import Operator

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _graph(path):
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return model.graph


def _assert_exports(model, tmp_path, sample, batch=3, opset=17, name="m"):
    """Export for one sample's shape, run a batch of ``batch`` in onnxruntime, compare with NeuroFlow in eval mode."""
    path = tmp_path / f"{name}.onnx"
    report = to_onnx(model, path, (1, *sample), opset=opset)
    graph = _graph(path)
    x = np.random.default_rng(1).standard_normal((batch, *sample)).astype(np.float32)
    model.eval()
    want = np.asarray(model.forward(x.astype(model.parameters()[0].data.dtype) if model.parameters() else x))
    got = _run(path, x)
    assert got.shape == want.shape == (batch, *report.output_shape[1:])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    return graph


def _ops(graph):
    return [node.op_type for node in graph.node]


def _randomize_batchnorm(model, seed=0):
    """Running statistics and affine parameters away from their initial 0/1, so that exporting them matters."""
    rng = np.random.default_rng(seed)
    for op in model.modules():
        if type(op).__name__ == "BatchNorm2d":
            c = op.num_features
            op.running_mean.data[...] = rng.normal(0, 0.1, c)
            op.running_var.data[...] = rng.uniform(0.5, 1.5, c)
            if op.affine:
                op.weight.data[...] = rng.uniform(0.5, 1.5, c)
                op.bias.data[...] = rng.normal(0, 0.1, c)
    return model


def _core_model():
    nf.manual_seed(0)
    return nf.Sequential(
        ops.Reshape(2, 6), ops.Flatten(), ops.Linear(12, 16), ops.LeakyReLU(0.2),
        nf.Residual(nf.Sequential(ops.Linear(16, 16), ops.GELU(), ops.Dropout(0.25))),
        nf.Residual(nf.Sequential(ops.Linear(16, 8), ops.Sigmoid()), shortcut=ops.Linear(16, 8)),
        nf.Concat(ops.Linear(8, 3), nf.Sequential(ops.Tanh(), ops.Linear(8, 2)), ops.ReLU(), axis=-1),
        ops.Softmax(),
    )


# --------------------------------------------------------------------------- core ops
@pytest.mark.parametrize("opset", [13, 17, 20])
def test_an_mlp_with_every_activation_runs_in_onnxruntime(tmp_path, opset):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(784, 64), ops.GELU(), ops.Dropout(0.3), ops.Linear(64, 32), ops.LeakyReLU(0.1),
                          ops.Linear(32, 32), ops.Sigmoid(), ops.Linear(32, 16), ops.Tanh(), ops.Linear(16, 10),
                          ops.ReLU(), ops.Softmax())
    graph = _assert_exports(model, tmp_path, (784,), opset=opset)
    kinds = _ops(graph)
    assert kinds.count("Gemm") == 5 and "Dropout" not in kinds
    assert ("Gelu" in kinds) == (opset >= 20)  # before opset 20 the tanh approximation is composed
    assert {i.name for i in graph.initializer} >= {"model.0.weight", "model.0.bias"}


def test_residual_concat_reshape_and_flatten_match(tmp_path):
    graph = _assert_exports(_core_model(), tmp_path, (12,), batch=5)
    assert _ops(graph).count("Add") >= 2 and "Concat" in _ops(graph)


def test_linear_on_more_than_two_dimensions_is_matmul_and_add(tmp_path):
    nf.manual_seed(0)
    graph = _assert_exports(nf.Sequential(ops.Linear(5, 4), ops.Softmax(axis=1)), tmp_path, (3, 5))
    assert _ops(graph)[:2] == ["MatMul", "Add"]


def test_the_batch_dimension_is_free(tmp_path):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(6, 3))
    to_onnx(model, tmp_path / "m.onnx", (1, 6))
    for batch in (1, 7):
        x = np.ones((batch, 6), np.float32)
        np.testing.assert_allclose(_run(tmp_path / "m.onnx", x), model.forward(x), rtol=1e-5)


def test_a_float64_model_exports_float32_weights(tmp_path):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(6, 5), ops.Tanh(), ops.Linear(5, 2)).astype(np.float64)
    graph = _assert_exports(model, tmp_path, (6,))
    assert {init.data_type for init in graph.initializer} == {onnx.TensorProto.FLOAT}


def test_an_int8_loaded_model_exports_its_dequantized_weights(tmp_path):
    nf.manual_seed(0)
    nf.save(nf.Sequential(ops.Linear(20, 8), ops.ReLU(), ops.Linear(8, 3)), tmp_path / "q.safetensors", quantize="int8")
    loaded = nf.load(tmp_path / "q.safetensors")
    graph = _assert_exports(loaded, tmp_path, (20,))
    weight = next(onnx.numpy_helper.to_array(i) for i in graph.initializer if i.name == "model.0.weight")
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(weight, loaded[0].weight.data)


def test_export_does_not_change_the_model(tmp_path):
    model = _core_model().train()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    to_onnx(model, tmp_path / "m.onnx", (1, 12))
    assert all(op.training for op in model.modules())
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


# --------------------------------------------------------------------------- vision ops
def _vision():
    return pytest.importorskip("neuroflow_ops_vision")


def test_neuroflow_cnn_exports_without_transposes(tmp_path):
    _vision()
    nf.manual_seed(0)
    model = _randomize_batchnorm(registry.models.get("neuroflow_cnn")())
    graph = _assert_exports(model, tmp_path, (1, 28, 28), batch=4)
    # its layers run in NHWC after the first convolution; ONNX keeps NCHW throughout and never transposes
    assert "Transpose" not in _ops(graph)
    assert {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool", "Sigmoid", "Mul"} <= set(_ops(graph))


def test_resnet18_exports(tmp_path):
    _vision()
    nf.manual_seed(0)
    model = _randomize_batchnorm(registry.models.get("resnet18")())
    graph = _assert_exports(model, tmp_path, (3, 32, 32), batch=2)
    assert "Transpose" not in _ops(graph) and _ops(graph).count("Conv") == 20


def _vision_cases():
    v = pytest.importorskip("neuroflow_ops_vision")
    seq = nf.Sequential
    return {
        "conv groups dilation stride padding": (seq(v.Conv2d(4, 8, 3, stride=2, padding=2, dilation=2, groups=2)),
                                                (4, 11, 13)),
        "conv nhwc rectangular": (seq(v.Conv2d(4, 8, (3, 1), stride=(1, 2), padding=(1, 0), layout="NHWC")), (9, 10, 4)),
        "conv to nhwc then flatten": (seq(v.Conv2d(3, 5, 3, output_layout="NHWC"), ops.Flatten()), (3, 6, 7)),
        "depthwise with multiplier": (seq(v.DepthwiseConv2d(4, 3, padding=1, depth_multiplier=2)), (4, 6, 6)),
        "separable": (seq(v.SeparableConv2d(4, 6, 3, stride=2, padding=1)), (4, 9, 9)),
        "batchnorm without affine, nhwc": (seq(v.BatchNorm2d(4, affine=False, layout="NHWC")), (5, 5, 4)),
        "batchnorm with relu": (seq(v.BatchNorm2d(3, activation="relu")), (3, 4, 4)),
        "maxpool padding dilation ceil relu": (seq(v.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True, activation="relu")),
                                               (3, 10, 11)),
        "maxpool ceil nhwc": (seq(v.MaxPool2d(2, ceil_mode=True, layout="NHWC")), (7, 9, 3)),
        "avgpool padding without pad count": (seq(v.AvgPool2d(3, 2, 1, count_include_pad=False)), (3, 10, 11)),
        "avgpool padding ceil": (seq(v.AvgPool2d(3, 2, 1, ceil_mode=True)), (3, 10, 11)),
        "global avgpool keepdims nhwc": (seq(v.GlobalAvgPool2d(keepdims=True, layout="NHWC")), (5, 6, 3)),
        "squeeze excite": (seq(v.SqueezeExcite(8, 2)), (8, 5, 5)),
        "upsample nearest x2": (seq(v.Upsample(scale_factor=2)), (3, 5, 6)),
        "upsample nearest to size, nhwc": (seq(v.Upsample(size=(7, 4), layout="NHWC")), (5, 6, 3)),
        "upsample bilinear x1.5x2.5": (seq(v.Upsample(scale_factor=(1.5, 2.5), mode="bilinear")), (3, 5, 6)),
        "upsample bilinear down to size": (seq(v.Upsample(size=(3, 2), mode="bilinear")), (3, 7, 5)),
        "upsample bilinear align corners": (seq(v.Upsample(scale_factor=2, mode="bilinear", align_corners=True)),
                                            (3, 5, 6)),
        "upsample bilinear align corners to size, nhwc": (
            seq(v.Upsample(size=(7, 4), mode="bilinear", align_corners=True, layout="NHWC")), (5, 6, 3)),
        "channel concat nhwc between layout conversions": (
            seq(v.ConvertLayout("NCHW", "NHWC"),
                v.ChannelConcat(v.Conv2d(3, 4, 1, layout="NHWC"), v.MaxPool2d(1, layout="NHWC"), layout="NHWC"),
                v.ConvertLayout("NHWC", "NCHW")), (3, 5, 5)),
        "softmax over channels of an nhwc map": (seq(v.Conv2d(3, 4, 1, output_layout="NHWC"), ops.Softmax(axis=-1)),
                                                 (3, 5, 5)),
        "residual of differently stored maps": (
            seq(nf.Residual(seq(v.ConvertLayout(), v.Conv2d(3, 3, 3, padding=1, layout="NHWC", output_layout="NCHW")))),
            (3, 5, 5)),
    }


@pytest.mark.parametrize("case", [
    "conv groups dilation stride padding", "conv nhwc rectangular", "conv to nhwc then flatten",
    "depthwise with multiplier", "separable", "batchnorm without affine, nhwc", "batchnorm with relu",
    "maxpool padding dilation ceil relu", "maxpool ceil nhwc", "avgpool padding without pad count",
    "avgpool padding ceil", "global avgpool keepdims nhwc", "squeeze excite", "upsample nearest x2",
    "upsample nearest to size, nhwc", "upsample bilinear x1.5x2.5", "upsample bilinear down to size",
    "upsample bilinear align corners", "upsample bilinear align corners to size, nhwc",
    "channel concat nhwc between layout conversions", "softmax over channels of an nhwc map",
    "residual of differently stored maps",
])
def test_vision_op_matches_onnxruntime(tmp_path, case):
    nf.manual_seed(0)
    model, sample = _vision_cases()[case]
    _assert_exports(_randomize_batchnorm(model), tmp_path, sample)


def test_nhwc_maps_are_transposed_only_where_their_layout_shows(tmp_path):
    v = _vision()
    nf.manual_seed(0)
    model = nf.Sequential(v.Conv2d(3, 4, 3, output_layout="NHWC"), v.BatchNorm2d(4, layout="NHWC"),
                          v.MaxPool2d(2, layout="NHWC"), ops.Flatten(), ops.Linear(4 * 2 * 2, 3))
    graph = _assert_exports(model, tmp_path, (3, 6, 6))
    assert _ops(graph).count("Transpose") == 1 and _ops(graph).index("Transpose") == _ops(graph).index("Reshape") - 1


# --------------------------------------------------------------------------- errors and plugins
class Swish(Operator):
    """x · σ(x): an op from a plugin, exported once the plugin registers a converter."""

    def forward(self, x):
        return x / (1.0 + np.exp(-x))


def test_an_op_without_converter_is_named_with_the_supported_ones(tmp_path):
    model = nf.Sequential(ops.Linear(4, 4), nf.Residual(Swish()))
    with pytest.raises(ExportError) as info:
        to_onnx(model, tmp_path / "m.onnx", (1, 4))
    message = str(info.value)
    assert "model.1.block is a Swish, which has no ONNX converter" in message
    assert "Linear" in message and "Sequential" in message and "register_converter" in message
    assert not (tmp_path / "m.onnx").exists()


def test_lora_adapters_are_refused_until_fused(tmp_path):
    nf.manual_seed(0)
    model = nf.lora.apply_lora(nf.Sequential(ops.Linear(6, 4), ops.ReLU(), ops.Linear(4, 2)), rank=2)
    model[0].lora_up.weight.data[...] = 0.5  # a trained-looking update, so fusing changes the function
    with pytest.raises(ExportError, match=r"model.0 is a LoRALinear.*fuse them first"):
        to_onnx(model, tmp_path / "m.onnx", (1, 6))
    _assert_exports(nf.lora.fuse(model), tmp_path, (6,))


def _swish(graph, op, x, where):
    return Value(graph.node("Mul", [x.name, graph.node("Sigmoid", [x.name], where)], where), x.shape, x.perm)


def test_a_plugin_registers_a_converter(tmp_path):
    register_converter("Swish", _swish)
    try:
        assert "Swish" in supported_ops()
        nf.manual_seed(0)
        _assert_exports(nf.Sequential(ops.Linear(4, 4), Swish()), tmp_path, (4,))
    finally:
        registry.onnx_converters.unregister("Swish")
    assert "Swish" not in supported_ops()


def test_a_plugin_declares_converters_as_entry_points(tmp_path, monkeypatch):
    from importlib import metadata

    real = metadata.entry_points
    swish = metadata.EntryPoint("Swish", f"{__name__}:_swish", "neuroflow_onnx")
    monkeypatch.setattr(metadata, "entry_points",
                        lambda group=None, **kw: [*real(group=group, **kw), *([swish] if group == "neuroflow_onnx" else [])])
    registry.onnx_converters.reset()
    try:
        assert "Swish" in supported_ops()
        nf.manual_seed(0)
        _assert_exports(nf.Sequential(ops.Linear(4, 4), Swish()), tmp_path, (4,))
    finally:
        monkeypatch.undo()
        registry.onnx_converters.reset()
    assert "Swish" not in supported_ops()


def test_the_core_and_vision_declare_their_converters_in_their_distributions():
    assert {registry.onnx_converters.distribution(n) for n in ("Linear", "ReLU", "Sequential", "Concat")} == {
        "neuroflow-core"}
    if "Conv2d" in registry.ops:
        vision = ("Conv2d", "DepthwiseConv2d", "SeparableConv2d", "ConvertLayout", "BatchNorm2d", "MaxPool2d",
                  "AvgPool2d", "GlobalAvgPool2d", "SqueezeExcite", "Upsample", "ChannelConcat", "BasicBlock", "ResNet")
        assert {registry.onnx_converters.distribution(n) for n in vision} == {"neuroflow-ops-vision"}


def test_batchnorm_with_batch_statistics_in_eval_is_refused(tmp_path):
    v = _vision()
    with pytest.raises(ExportError, match="track_running_stats=False"):
        to_onnx(nf.Sequential(v.BatchNorm2d(3, track_running_stats=False)), tmp_path / "m.onnx", (1, 3, 4, 4))


@pytest.mark.parametrize("kwargs, message", [
    ({"opset": 12}, "opset must be an integer from 13"),
    ({"opset": 10_000}, "opset must be an integer from 13"),
    ({"input_shape": (1, 0)}, "input_shape must be positive integers"),
    ({"input_shape": ()}, "input_shape must be positive integers"),
])
def test_bad_options_are_refused(tmp_path, kwargs, message):
    arguments = {"input_shape": (1, 4), **kwargs}
    with pytest.raises(ExportError, match=message):
        to_onnx(nf.Sequential(ops.Linear(4, 2)), tmp_path / "m.onnx", **arguments)


def test_an_input_shape_the_model_does_not_take_is_a_shape_error(tmp_path):
    with pytest.raises(nf.errors.ShapeError, match=r"Linear\(4→2\) got input of shape \(1, 5\)"):
        to_onnx(nf.Sequential(ops.Linear(4, 2)), tmp_path / "m.onnx", (1, 5))


def test_without_the_onnx_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    with pytest.raises(ExportError, match=r"pip install 'neuroflow-core\[onnx\]'"):
        to_onnx(nf.Sequential(ops.Linear(4, 2)), tmp_path / "m.onnx", (1, 4))


# --------------------------------------------------------------------------- command line
def test_cli_exports_a_saved_model(tmp_path, capsys):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(10, 6), ops.GELU(), ops.Linear(6, 3))
    nf.save(model, tmp_path / "m.safetensors")
    assert main(["export", str(tmp_path / "m.safetensors"), "--onnx", str(tmp_path / "m.onnx")]) == 0
    assert "input (batch, 10) → output (batch, 3)" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    np.testing.assert_allclose(_run(tmp_path / "m.onnx", x), model.eval().forward(x), rtol=1e-4, atol=1e-6)


def test_cli_exports_a_cnn_given_its_sample_shape(tmp_path, capsys):
    _vision()
    nf.manual_seed(0)
    model = _randomize_batchnorm(registry.models.get("neuroflow_cnn")())
    nf.save(model, tmp_path / "cnn.safetensors")
    args = ["export", str(tmp_path / "cnn.safetensors"), "--onnx", str(tmp_path / "cnn.onnx")]
    assert main(args) == 2
    assert "pass --input-shape" in capsys.readouterr().err
    assert main([*args, "--input-shape", "1,28,28", "--opset", "20"]) == 0
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    want = model.eval().forward(x)
    np.testing.assert_allclose(_run(tmp_path / "cnn.onnx", x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_cli_reports_a_bad_opset_and_a_broken_file(tmp_path, capsys):
    nf.save(nf.Sequential(ops.Linear(4, 2)), tmp_path / "m.safetensors")
    assert main(["export", str(tmp_path / "m.safetensors"), "--onnx", str(tmp_path / "m.onnx"), "--opset", "9"]) == 1
    assert "opset must be an integer from 13" in capsys.readouterr().err
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    assert main(["export", str(tmp_path / "bad.safetensors"), "--onnx", str(tmp_path / "m.onnx")]) == 1
    assert "header length" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()
