"""Model files: exact round trips through the op registry, INT8, PyTorch state_dicts, refusals with clear errors."""

from __future__ import annotations

import json
import os
import struct
import tracemalloc

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.checkpoint import CheckpointError, load_state_dict_file, quantization_of, register_children
from neuroflow.checkpoint import topology as topology_module
from neuroflow.checkpoint.container import read_array, read_header
from neuroflow.operator import Operator
from neuroflow.tensor import Tensor


def _every_core_op(seed: int = 0) -> nf.Sequential:
    nf.manual_seed(seed)
    return nf.Sequential(
        ops.Reshape(2, 6), ops.Flatten(), ops.Linear(12, 16), ops.LeakyReLU(0.2),
        nf.Residual(nf.Sequential(ops.Linear(16, 16), ops.GELU(), ops.Dropout(0.25))),
        nf.Residual(nf.Sequential(ops.Linear(16, 8), ops.Sigmoid()), shortcut=ops.Linear(16, 8)),
        nf.Concat(ops.Linear(8, 3), nf.Sequential(ops.Tanh(), ops.Linear(8, 2)), ops.ReLU(), axis=-1),
        ops.Softmax(),
    )


def _same_state(a: Operator, b: Operator) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(
        sa[k].dtype == sb[k].dtype and np.array_equal(sa[k], sb[k]) for k in sa
    )


def _x(n=5, features=12, seed=1):
    return np.random.default_rng(seed).standard_normal((n, features)).astype(np.float32)


def test_round_trip_rebuilds_every_core_op_and_composite_exactly(tmp_path):
    model = _every_core_op()
    report = nf.save(model, tmp_path / "m.safetensors")
    assert report.quantization is None and report.file_bytes == os.path.getsize(tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert repr(loaded) == repr(model)
    assert _same_state(model, loaded)
    model.eval(), loaded.eval()
    np.testing.assert_array_equal(loaded.forward(_x()), model.forward(_x()))
    # dropout keeps its seed: the same masks in training mode
    model.train(), loaded.train()
    np.testing.assert_array_equal(loaded.forward(_x()), model.forward(_x()))


def test_file_is_plain_safetensors_with_json_metadata_and_no_pickle(tmp_path):
    from safetensors import safe_open

    model = _every_core_op()
    nf.save(model, tmp_path / "m.safetensors", metadata={"dataset": "blobs", "epochs": 3})
    with safe_open(tmp_path / "m.safetensors", framework="np") as f:
        meta = f.metadata()
        stored = {name: f.get_tensor(name) for name in f.keys()}
    assert meta["format"] == "neuroflow.model" and meta["format_version"] == "1"
    topo = json.loads(meta["topology"])
    assert topo["root"]["type"] == "Sequential" and topo["ops"]["Linear"]["distribution"] == "neuroflow-core"
    assert topo["ops"]["Linear"]["version"] == nf.__version__
    assert json.loads(meta["user"]) == {"dataset": "blobs", "epochs": 3}
    assert nf.checkpoint.open_model_file(tmp_path / "m.safetensors").user == {"dataset": "blobs", "epochs": 3}
    for name, array in model.state_dict().items():
        np.testing.assert_array_equal(stored[name], array)
    assert b"pickle" not in (tmp_path / "m.safetensors").read_bytes()


def test_float64_model_and_eval_mode_are_restored(tmp_path):
    model = nf.Sequential(ops.Linear(3, 2)).astype(np.float64).eval()
    nf.save(model, tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors", device="cpu")
    assert loaded[0].weight.dtype == np.float64 and not loaded.training
    assert _same_state(model, loaded)


def test_loading_does_not_move_the_users_random_stream(tmp_path):
    nf.save(_every_core_op(), tmp_path / "m.safetensors")
    nf.manual_seed(5)
    expected = nf.random.generator().random(3)
    nf.manual_seed(5)
    nf.load(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(nf.random.generator().random(3), expected)


def test_plugin_ops_round_trip_when_installed(tmp_path):
    pytest.importorskip("neuroflow_ops_recurrent")
    model = nf.Sequential(ops.GRU(3, 5), ops.Linear(5, 2))
    nf.save(model, tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert _same_state(model, loaded)
    topo = nf.checkpoint.open_model_file(tmp_path / "m.safetensors").topology
    assert topo["ops"]["GRU"]["distribution"] == "neuroflow-ops-recurrent"


@pytest.mark.parametrize("builder", ["neuroflow_cnn", "resnet18"])
def test_registered_vision_models_round_trip_exactly_and_in_int8(tmp_path, builder):
    pytest.importorskip("neuroflow_ops_vision")
    nf.manual_seed(0)
    model = registry.models.get(builder)()
    nf.save(model, tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert _same_state(model, loaded)
    x = np.random.default_rng(0).random((2, 1, 28, 28) if builder == "neuroflow_cnn" else (1, 3, 32, 32),
                                        dtype=np.float32)
    model.eval(), loaded.eval()
    np.testing.assert_array_equal(loaded.forward(x), model.forward(x))
    report = nf.save(model, tmp_path / "q.safetensors", quantize="int8")
    assert report.quantization.max_relative_error < 0.01
    quantized = nf.load(tmp_path / "q.safetensors").eval()
    out, reference = quantized.forward(x), model.forward(x)
    assert np.abs(out - reference).max() < 0.05 * np.abs(reference).max()


def test_a_model_being_trained_saves_and_loads(tmp_path):
    model = _every_core_op()
    trainer = nf.Trainer(model, loss=nf.losses.MSE(), batch_size=5, progress=False)
    trainer.train_step(_x(), np.zeros((5, 13), np.float32))  # parameters now live in the flat buffer
    nf.save(model, tmp_path / "m.safetensors")
    assert _same_state(model, nf.load(tmp_path / "m.safetensors"))


# --------------------------------------------------------------------------- INT8
def _mnist_mlp():
    nf.manual_seed(0)
    return nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))


def test_int8_file_is_under_a_third_of_float_and_reports_its_error(tmp_path):
    model = _mnist_mlp()
    nf.save(model, tmp_path / "f.safetensors")
    report = nf.save(model, tmp_path / "q.safetensors", quantize="int8")
    ratio = os.path.getsize(tmp_path / "q.safetensors") / os.path.getsize(tmp_path / "f.safetensors")
    assert ratio <= 0.3
    q = report.quantization
    assert [t.name for t in q.tensors] == ["0.weight", "2.weight", "4.weight"]
    assert [t.name for t in q.float16] == ["0.bias", "2.bias", "4.bias"] and q.kept_float == ()
    for row in q.tensors:  # symmetric 8-bit: at most half a step of the largest channel (float16 steps: +2^-10)
        assert 0 < row.max_abs_error <= row.max_abs_value / 254 * (1 + 2**-10)
        assert 0 < row.relative_error < 0.01
    for row in q.float16:
        assert row.max_abs_error <= row.max_abs_value * 2**-11 and row.relative_error < 2**-11
    assert q.max_abs_error == max(t.max_abs_error for t in q.tensors + q.float16)
    assert "0.weight" in str(report) and "float16" in str(report)

    loaded = nf.load(tmp_path / "q.safetensors")
    assert quantization_of(loaded) == "int8" and quantization_of(model) is None
    w, w8 = model[0].weight.data, loaded[0].weight.data
    assert w8.dtype == np.float32
    header = read_header(tmp_path / "q.safetensors")
    assert header.tensors["0.bias"].code == "F16"
    with open(tmp_path / "q.safetensors", "rb") as handle:
        scale = read_array(handle, header.tensors["0.weight::scale"])
    ideal = np.abs(w).max(axis=1) / 127
    assert scale.dtype == np.float16 and np.all((scale >= ideal) & (scale <= ideal * (1 + 2**-10)))
    steps = w8 / scale.astype(np.float32)[:, None]
    np.testing.assert_allclose(steps, np.rint(steps), atol=1e-3)  # on the INT8 grid
    assert np.abs(np.rint(steps)).max() == 127
    assert np.abs(w8 - w).max() == pytest.approx(q.tensors[0].max_abs_error, rel=1e-6)
    np.testing.assert_array_equal(loaded[0].bias.data, model[0].bias.data.astype(np.float16).astype(np.float32))
    x = np.random.default_rng(0).random((64, 784), dtype=np.float32)
    model.eval(), loaded.eval()
    assert np.abs(loaded.forward(x) - model.forward(x)).max() < 0.05


def test_int8_steps_and_other_tensors_fall_back_to_float32_outside_float16s_range(tmp_path):
    model = nf.Sequential(ops.Linear(4, 3), ops.Linear(3, 2))
    model[0].weight.data[1] = 1e-4  # a step of 1e-4 / 127 is below float16's normal range
    model[1].bias.data[0] = 1e5  # beyond float16's largest value
    report = nf.save(model, tmp_path / "q.safetensors", quantize="int8")
    header = read_header(tmp_path / "q.safetensors")
    codes = {name: entry.code for name, entry in header.tensors.items()}
    assert codes["0.weight::scale"] == "F32" and codes["1.weight::scale"] == "F16"
    assert codes["1.bias"] == "F32" and codes["0.bias"] == "F16"
    assert report.quantization.kept_float == ("1.bias",)
    loaded = nf.load(tmp_path / "q.safetensors")
    np.testing.assert_allclose(loaded[0].weight.data[1], 1e-4, rtol=1e-6)
    assert loaded[1].bias.data[0] == 1e5


def test_a_quantized_model_is_not_quantized_twice_but_saves_as_float(tmp_path):
    nf.save(_mnist_mlp(), tmp_path / "q.safetensors", quantize="int8")
    loaded = nf.load(tmp_path / "q.safetensors")
    with pytest.raises(CheckpointError, match="already quantized"):
        nf.save(loaded, tmp_path / "again.safetensors", quantize="int8")
    assert not (tmp_path / "again.safetensors").exists()
    nf.save(loaded, tmp_path / "float.safetensors")
    reloaded = nf.load(tmp_path / "float.safetensors")
    assert _same_state(loaded, reloaded) and quantization_of(reloaded) == "int8"


def test_quantization_refuses_non_finite_weights_and_unknown_schemes(tmp_path):
    model = _mnist_mlp()
    with pytest.raises(CheckpointError, match="quantize must be None or 'int8'"):
        nf.save(model, tmp_path / "m.safetensors", quantize="int4")
    model[2].weight.data[0, 0] = np.nan
    with pytest.raises(CheckpointError, match="cannot quantize '2.weight'"):
        nf.save(model, tmp_path / "m.safetensors", quantize="int8")
    assert list(tmp_path.iterdir()) == []


def test_an_all_zero_channel_quantizes_to_zeros(tmp_path):
    model = nf.Sequential(ops.Linear(4, 3))
    model[0].weight.data[1] = 0
    nf.save(model, tmp_path / "q.safetensors", quantize="int8")
    np.testing.assert_array_equal(nf.load(tmp_path / "q.safetensors")[0].weight.data[1], 0)


class CopyingBackend(nf.backends.Backend):
    """A stand-in device: numpy arrays, but every transfer copies, as a real device's would."""

    name = "copying"

    def from_host(self, array):
        return np.array(array, copy=True)

    def to_host(self, array):
        return np.array(array, copy=True)


def test_train_save_int8_load_on_another_backend_and_predict(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = (rng.standard_normal((300, 12)) + 2 * y[:, None]).astype(np.float32)
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(12, 32), ops.ReLU(), ops.Dropout(0.1), ops.Linear(32, 3))
    trainer = nf.Trainer(model, batch_size=32, progress=False)
    trainer.fit((x, y), epochs=3)
    nf.save(model, tmp_path / "model.safetensors", quantize="int8")

    device = CopyingBackend()
    loaded = nf.load(tmp_path / "model.safetensors", device=device)
    assert loaded.backend is device and loaded[0].backend is device
    predicted = nf.Trainer(loaded, device=device, progress=False).predict(x)
    expected = trainer.predict(x)
    assert predicted.shape == (300, 3)
    assert (predicted.argmax(1) == expected.argmax(1)).mean() > 0.97
    np.testing.assert_allclose(predicted, expected, atol=0.02)


# --------------------------------------------------------------------------- topology and plugins
class Doubler(Operator):
    """A plugin composite: its constructor takes a child operator."""

    def __init__(self, inner: Operator, times: int = 2) -> None:
        super().__init__()
        self.inner, self.times = inner, times

    def forward(self, x):
        return self.inner.forward(x) * self.times

    def get_config(self):
        return {"times": self.times}


class Unregistered(Operator):
    def forward(self, x):
        return x


class Stack(Operator):
    """A composite taking its children positionally, with no codec."""

    def __init__(self, *layers: Operator) -> None:
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)


class ScaledConcat(nf.Concat):
    """A Concat subclass whose constructor still takes the branches: it inherits Concat's codec."""

    def __init__(self, *branches: Operator, scale: float = 1.0) -> None:
        super().__init__(*branches, axis=-1)
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale

    def get_config(self):
        return {"scale": self.scale}


class TwoLayers(nf.Sequential):
    """A Sequential subclass that builds its own children from its config: saved as a leaf."""

    def __init__(self, width: int) -> None:
        super().__init__(ops.Linear(3, width), ops.Tanh())
        self.width = width

    def get_config(self):
        return {"width": self.width}


@pytest.fixture
def doubler_registered(monkeypatch):
    monkeypatch.setattr(topology_module, "_CODECS", dict(topology_module._CODECS))
    registry.ops.register("Doubler", Doubler)
    yield
    registry.ops.unregister("Doubler")


def test_a_composite_needs_a_child_codec_and_then_round_trips(tmp_path, doubler_registered):
    model = nf.Sequential(Doubler(ops.Linear(3, 2), times=3))
    with pytest.raises(CheckpointError, match=r"model\.0 \(Doubler\): get_config\(\) lacks the constructor "
                                              r"argument\(s\) inner.*register_children"):
        nf.save(model, tmp_path / "m.safetensors")
    register_children(Doubler, lambda op: [op.inner])
    nf.save(model, tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert isinstance(loaded[0], Doubler) and loaded[0].times == 3
    x = _x(features=3)
    np.testing.assert_array_equal(loaded.forward(x), model.forward(x))


@pytest.fixture
def local_ops(monkeypatch):
    names = {"Stack": Stack, "ScaledConcat": ScaledConcat, "TwoLayers": TwoLayers}
    for name, cls in names.items():
        registry.ops.register(name, cls)
    yield
    for name in names:
        registry.ops.unregister(name)


def test_subclasses_inherit_a_codec_only_while_their_constructor_takes_the_children(tmp_path, local_ops):
    model = nf.Sequential(ScaledConcat(ops.Linear(3, 2), ops.Tanh(), scale=0.5), TwoLayers(width=4))
    nf.save(model, tmp_path / "m.safetensors")
    topo = nf.checkpoint.open_model_file(tmp_path / "m.safetensors").topology["root"]["children"]
    assert [len(node.get("children", [])) for node in topo] == [2, 0]
    loaded = nf.load(tmp_path / "m.safetensors")
    assert loaded[0].scale == 0.5 and loaded[1].width == 4
    assert _same_state(model, loaded)
    with pytest.raises(CheckpointError, match=r"model\.0 \(Stack\) has child ops that its constructor takes "
                                              "positionally; register a child codec"):
        nf.save(nf.Sequential(Stack(ops.ReLU())), tmp_path / "s.safetensors")


def test_an_unregistered_op_is_refused_at_save_time(tmp_path):
    with pytest.raises(CheckpointError, match=r"model\.1 is a .*Unregistered, which is not a registered op"):
        nf.save(nf.Sequential(ops.ReLU(), Unregistered()), tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_plugin_op_names_the_known_distribution(tmp_path, monkeypatch, doubler_registered):
    register_children(Doubler, lambda op: [op.inner])
    nf.save(nf.Sequential(Doubler(ops.ReLU())), tmp_path / "m.safetensors")
    registry.ops.unregister("Doubler")
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_ops"], "Doubler", "neuroflow-ops-doubling")
    with pytest.raises(CheckpointError, match="op 'Doubler' needs the distribution neuroflow-ops-doubling: "
                                              "pip install neuroflow-ops-doubling"):
        nf.load(tmp_path / "m.safetensors")


def _file_naming(tmp_path, op_type: str, distribution) -> str:
    """A model file whose second op is ``op_type``, recorded as coming from ``distribution``."""
    from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload, write_model_file

    tensors, meta = model_payload(nf.Sequential(ops.Linear(4, 3), ops.Tanh()), MODEL_FORMAT, None)
    topo = json.loads(meta["topology"])
    topo["root"]["children"][1]["type"] = op_type
    topo["ops"][op_type] = {"distribution": distribution, "version": "1.0"}
    write_model_file(tmp_path / "m.safetensors", tensors, {**meta, "topology": json.dumps(topo)})
    return str(tmp_path / "m.safetensors")


@pytest.mark.parametrize(("distribution", "message"), [
    ("neuroflow-ops-fancy", "unknown op 'FancyConv' (no installed distribution provides it); the file says it comes "
                            "from the distribution 'neuroflow-ops-fancy', which NeuroFlow does not know: make sure"),
    ("evil-package; curl x|sh", "the file names an invalid distribution 'evil-package; curl x|sh' for it, which "
                                "cannot be installed"),
    ("-rf", "the file names an invalid distribution '-rf'"),
    ("pkg\x1b[2J", "the file names an invalid distribution 'pkg\\x1b[2J'"),
    (["a list"], "the file names an invalid distribution ['a list']"),
    (None, "unknown op 'FancyConv' (no installed distribution provides it)"),
])
def test_a_distribution_a_file_names_is_never_shown_as_an_install_command(tmp_path, distribution, message):
    with pytest.raises(CheckpointError) as info:
        nf.load(_file_naming(tmp_path, "FancyConv", distribution))
    assert message in str(info.value)
    assert "pip install" not in str(info.value) and str(info.value).isprintable()


def test_a_known_provider_is_advised_whatever_the_file_says(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.KNOWN_PROVIDERS["neuroflow_ops"], "FancyConv", "neuroflow-ops-fancy")
    with pytest.raises(CheckpointError, match="op 'FancyConv' needs the distribution neuroflow-ops-fancy: "
                                              "pip install neuroflow-ops-fancy$"):
        nf.load(_file_naming(tmp_path, "FancyConv", "evil-package; curl x|sh"))


def test_op_types_that_are_no_op_name_are_refused_before_they_are_shown(tmp_path):
    with pytest.raises(CheckpointError) as info:
        nf.load(_file_naming(tmp_path, "Tanh\x1b]0;owned\x07", None))
    assert "op model.1 has type 'Tanh\\x1b]0;owned\\x07', which is not an op name" in str(info.value)
    assert str(info.value).isprintable()
    registry.ops.register("Two words", Unregistered)
    try:
        with pytest.raises(CheckpointError, match="model.0 is registered as 'Two words', which a model file cannot name"):
            nf.save(nf.Sequential(Unregistered()), tmp_path / "u.safetensors")
    finally:
        registry.ops.unregister("Two words")


class Echoing(Operator):
    """Refuses its config the way many constructors do: repeating the value it was given."""

    def __init__(self, mode: str = "a") -> None:
        super().__init__()
        if mode != "a":
            raise ValueError(f"unknown mode {mode}")
        self.mode = mode

    def forward(self, x):
        return x

    def get_config(self):
        return {"mode": self.mode}


def test_what_a_file_makes_a_constructor_say_reaches_the_message_escaped(tmp_path, monkeypatch):
    from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload, write_model_file

    registry.ops.register("Echoing", Echoing)
    try:
        tensors, meta = model_payload(nf.Sequential(Echoing()), MODEL_FORMAT, None)
        topo = json.loads(meta["topology"])
        topo["root"]["children"][0]["config"]["mode"] = "\x1b[31mred\nline"
        write_model_file(tmp_path / "m.safetensors", tensors, {**meta, "topology": json.dumps(topo)})
        with pytest.raises(CheckpointError) as info:
            nf.load(tmp_path / "m.safetensors")
    finally:
        registry.ops.unregister("Echoing")
    assert "ValueError: unknown mode \\x1b[31mred\\nline" in str(info.value) and str(info.value).isprintable()


def test_tensor_names_from_a_file_reach_the_message_escaped(tmp_path):
    from safetensors.numpy import save_file

    save_file({"0.weight": np.ones((3, 4), np.float32), "0.bias": np.ones(3, np.float32),
               "x\x1b[2J": np.ones(1, np.float32)}, tmp_path / "evil.st")
    with pytest.raises(CheckpointError) as info:
        load_state_dict_file(nf.Sequential(ops.Linear(4, 3)), tmp_path / "evil.st")
    assert "unexpected x\\x1b[2J" in str(info.value) and str(info.value).isprintable()


def test_a_hostile_topology_is_refused_before_its_parameters_exist(tmp_path):
    from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload, write_model_file

    tensors, meta = model_payload(nf.Sequential(ops.Linear(4, 3)), MODEL_FORMAT, None)
    topo = json.loads(meta["topology"])
    topo["root"]["children"][0]["config"].update(in_features=300_000, out_features=300_000)  # 720 GB as float64
    write_model_file(tmp_path / "m.safetensors", tensors, {**meta, "topology": json.dumps(topo)})
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="refusing to allocate"):
            nf.load(tmp_path / "m.safetensors")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    import safetensors.numpy

    path = tmp_path / "m.safetensors"
    nf.save(_mnist_mlp(), path)
    before = path.read_bytes()

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        nf.save(_every_core_op(), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


# --------------------------------------------------------------------------- PyTorch state_dicts
def _raw_safetensors(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    """A safetensors file written by hand, for dtypes numpy cannot name (BF16)."""
    header, chunks, offset = {}, [], 0
    for name, (code, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def test_state_dict_file_loads_by_name_converting_half_precision(tmp_path):
    model = nf.Sequential(ops.Linear(4, 3), ops.ReLU(), ops.Linear(3, 2))
    rng = np.random.default_rng(0)
    w0, b0 = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float16)
    w2 = rng.standard_normal((2, 3)).astype(np.float32)
    bf16 = (w2.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bfloat16
    content = _raw_safetensors({
        "module.0.weight": ("F32", w0), "module.0.bias": ("F16", b0), "module.2.weight": ("BF16", bf16),
        "module.2.bias": ("F64", np.arange(2.0)), "module.1.num_batches_tracked": ("I64", np.array(7)),
    })
    (tmp_path / "torch.safetensors").write_bytes(content)
    keys = load_state_dict_file(model, tmp_path / "torch.safetensors", strip_prefix="module.")
    assert keys.missing == keys.unexpected == () and keys.skipped == ("module.1.num_batches_tracked",)
    np.testing.assert_array_equal(model[0].weight.data, w0)
    np.testing.assert_array_equal(model[0].bias.data, b0.astype(np.float32))
    np.testing.assert_array_equal(model[2].weight.data, (bf16.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(model[2].bias.data, [0.0, 1.0])


def test_state_dict_file_refuses_mismatches_and_leaves_the_model_untouched(tmp_path):
    from safetensors.numpy import save_file

    model = nf.Sequential(ops.Linear(4, 3))
    before = model[0].weight.data.copy()
    save_file({"0.weight": np.ones((3, 5), np.float32), "0.bias": np.ones(3, np.float32)}, tmp_path / "a.st")
    with pytest.raises(CheckpointError, match=r"0.weight has shape \(3, 5\); the model's 0.weight is \(3, 4\)"):
        load_state_dict_file(model, tmp_path / "a.st")
    save_file({"0.weight": np.ones((3, 4), np.float32), "fc.bias": np.ones(3, np.float32)}, tmp_path / "b.st")
    with pytest.raises(CheckpointError, match="missing 0.bias; unexpected fc.bias"):
        load_state_dict_file(model, tmp_path / "b.st")
    np.testing.assert_array_equal(model[0].weight.data, before)
    keys = load_state_dict_file(model, tmp_path / "b.st", strict=False)
    assert keys.loaded == ("0.weight",) and keys.missing == ("0.bias",) and keys.unexpected == ("fc.bias",)
    np.testing.assert_array_equal(model[0].weight.data, 1.0)
    (tmp_path / "c.st").write_bytes(b"\x05" * 7)
    with pytest.raises(CheckpointError, match="too short"):
        load_state_dict_file(model, tmp_path / "c.st")


def test_a_real_pytorch_state_dict_gives_pytorchs_outputs(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    save_file(reference.state_dict(), tmp_path / "torch.safetensors")
    model = nf.Sequential(ops.Linear(6, 5), ops.ReLU(), ops.Linear(5, 3))
    load_state_dict_file(model, tmp_path / "torch.safetensors")
    x = _x(features=6)
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.forward(x), expected, rtol=1e-6, atol=1e-6)


def test_a_state_dict_file_is_not_a_model_file(tmp_path):
    from safetensors.numpy import save_file

    save_file({"0.weight": np.ones((3, 4), np.float32)}, tmp_path / "torch.safetensors")
    with pytest.raises(CheckpointError, match="load_state_dict_file"):
        nf.load(tmp_path / "torch.safetensors")


def test_errors_are_neuroflow_errors_and_value_errors(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"")
    with pytest.raises(nf.errors.NeuroFlowError) as info:
        nf.load(tmp_path / "x.safetensors")
    assert isinstance(info.value, ValueError) and isinstance(info.value, CheckpointError)
    with pytest.raises(CheckpointError, match="cannot read"):
        nf.load(tmp_path / "missing.safetensors")


def test_tensor_checksum_covers_name_dtype_shape_and_bytes():
    from neuroflow.checkpoint.model_file import tensor_checksum

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = tensor_checksum("w", "F32", (2, 3), a)
    assert base != tensor_checksum("v", "F32", (2, 3), a)
    assert base != tensor_checksum("w", "I32", (2, 3), a)
    assert base != tensor_checksum("w", "F32", (3, 2), a)
    b = a.copy()
    b.reshape(-1).view(np.uint8)[5] ^= 1
    assert base != tensor_checksum("w", "F32", (2, 3), b)


def test_a_loaded_model_trains(tmp_path):
    # a loaded model's parameters are ordinary arrays the Trainer can pack into its flat buffer
    nf.save(_every_core_op(), tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert all(isinstance(p, Tensor) and p.data.flags.c_contiguous for p in loaded.parameters())
    trainer = nf.Trainer(loaded, loss=nf.losses.MSE(), batch_size=5, progress=False)
    assert np.isfinite(trainer.train_step(_x(), np.zeros((5, 13), np.float32)))


def test_the_guarded_generator_hands_out_placeholders_within_its_budget_only():
    from neuroflow.checkpoint.allocation_guard import RebuildBudget, limit_allocations

    before = nf.random.generator()
    with pytest.raises(CheckpointError, match=r"the topology asks for 24,000,000 bytes \(random draws from normal\)"):
        with limit_allocations(RebuildBudget(held=10), source="f") as guard:
            assert nf.random.generator() is guard
            assert guard.uniform(-1, 1, (2, 3)).dtype == np.float64
            assert guard.standard_normal((4,), np.float32).dtype == np.float32
            out = np.ones(3)
            assert guard.random(out=out) is out and not out.any()
            assert 0 <= guard.integers(0, 10) < 10 and sorted(guard.permutation(5)) == [0, 1, 2, 3, 4]
            assert isinstance(guard.uniform(), float)
            guard.normal(0, 1, (1000, 3000))
    assert nf.random.generator() is before
