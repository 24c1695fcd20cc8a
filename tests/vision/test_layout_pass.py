"""The layout pass: a model written in NCHW runs its feature-map chains in NHWC, converted once at each end, and
stays, to its user, the model they wrote."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import neuroflow as nf
import neuroflow.trainer.session
from neuroflow import ops
from neuroflow.fusion import ActivationFused, fuse
from neuroflow.layout_pass import Conversion, LayoutPlanned, plan_layouts
from neuroflow.testing import gradcheck
from neuroflow_ops_vision import (
    AvgPool2d,
    BatchNorm2d,
    ChannelConcat,
    Conv2d,
    ConvertLayout,
    GlobalAvgPool2d,
    MaxPool2d,
    SeparableConv2d,
    SqueezeExcite,
    Upsample,
    neuroflow_cnn,
    resnet18,
)

from .model_step import forward_backward


def spec_cnn(width: int = 8) -> nf.Sequential:
    """The spec's small CNN as a PyTorch user writes it (narrower): no layout argument anywhere."""
    return nf.Sequential(ops.Conv2d(3, width, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                         ops.Conv2d(width, 2 * width, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                         ops.Flatten(), ops.Linear(2 * width * 2 * 2, 5))


def residual_net() -> nf.Sequential:
    """Conv-BN-ReLU, an identity and a projected Residual, average and global pooling."""
    return nf.Sequential(
        Conv2d(3, 8, 3, padding=1, bias=False), BatchNorm2d(8), ops.ReLU(),
        nf.Residual(nf.Sequential(Conv2d(8, 8, 3, padding=1), BatchNorm2d(8), ops.ReLU(), Conv2d(8, 8, 3, padding=1),
                                  BatchNorm2d(8))),
        ops.ReLU(),
        nf.Residual(nf.Sequential(Conv2d(8, 16, 3, stride=2, padding=1), BatchNorm2d(16)),
                    nf.Sequential(Conv2d(8, 16, 1, stride=2), BatchNorm2d(16))),
        AvgPool2d(2), GlobalAvgPool2d(), ops.Linear(16, 5))


def branching_net() -> nf.Sequential:
    """Concat of branches, upsampling, squeeze-excite, a separable conv, then Flatten."""
    return nf.Sequential(
        Conv2d(3, 8, 3, padding=1), ops.ReLU(),
        ChannelConcat(nf.Sequential(Conv2d(8, 4, 1), ops.ReLU()),
                      nf.Sequential(MaxPool2d(2), Conv2d(8, 4, 3, padding=1), Upsample(scale_factor=2))),
        SqueezeExcite(8), SeparableConv2d(8, 8, 3, padding=1), BatchNorm2d(8), ops.ReLU(),
        Upsample(scale_factor=0.5, mode="bilinear"), ops.Flatten(), ops.Linear(8 * 4 * 4, 5))


def pool_first() -> nf.Sequential:
    """A chain whose first layers cannot convert for themselves: a ConvertLayout at the entry."""
    return nf.Sequential(BatchNorm2d(3), MaxPool2d(2), Conv2d(3, 4, 3), ops.Tanh(), ops.Flatten(), ops.Linear(16, 5))


MODELS: dict[str, Callable[[], nf.Sequential]] = {
    "spec cnn": spec_cnn, "residual": residual_net, "branches": branching_net, "pool first": pool_first,
}


def build(make: Callable[[], nf.Operator], dtype: type = np.float32, seed: int = 0) -> nf.Operator:
    nf.manual_seed(seed)
    return make().astype(dtype)


def batch(n: int = 4, dtype: type = np.float32, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 8, 8)).astype(dtype), rng.integers(0, 5, n)


def assert_close(got: list[np.ndarray], want: list[np.ndarray], rtol: float, atol: float = 0.0) -> None:
    """Each array within ``rtol`` of the largest magnitude in its reference (and ``atol``); an array whose exact
    values are 0 (a convolution's bias before a BatchNorm) within ``rtol`` of a hundredth of the largest overall."""
    overall = max(float(np.max(np.abs(b))) for b in want if b.size)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-2 * overall)
        np.testing.assert_allclose(a, b, rtol=0, atol=atol + rtol * scale, err_msg=f"array {i}")


def kinds(run: list[nf.Operator]) -> list[str]:
    """The run as ``Name[in→out]`` for planned layers and ``ConvertLayout`` for the conversions."""
    out = []
    for layer in run:
        if isinstance(layer, Conversion):
            out.append(f"Convert[{layer.convert.source}→{layer.convert.target}]")
        elif isinstance(layer, LayoutPlanned):
            inner = layer.op.op if isinstance(layer.op, ActivationFused) else layer.op
            out.append(f"{type(inner).__name__}[{layer.layouts[0]}→{layer.layouts[1]}]")
        else:
            out.append(type(layer).__name__)
    return out


# ---------------------------------------------------------------- where the pass converts
def test_the_spec_cnn_runs_nhwc_between_its_first_convolution_and_one_conversion_before_flatten():
    model = build(spec_cnn)
    fuse(model)
    assert plan_layouts(model) == 5
    # the entry conversion is the first convolution's own (it reads NCHW, writes NHWC); the ReLUs run inside the pools
    assert kinds(model.running_layers) == [
        "Conv2d[NCHW→NHWC]", "MaxPool2d[NHWC→NHWC]", "Conv2d[NHWC→NHWC]", "MaxPool2d[NHWC→NHWC]",
        "Convert[NHWC→NCHW]", "Flatten", "Linear"]
    assert all(isinstance(layer.op, ActivationFused) for layer in model.running_layers[1:4:2])


def test_composites_are_planned_through_their_children():
    model = build(residual_net)
    fuse(model)
    plan_layouts(model)
    # one conversion in all, the first convolution's: the Residuals' blocks and shortcuts run in NHWC, and the
    # global pool's (N, C) output needs none
    assert kinds(model.running_layers) == [
        "Conv2d[NCHW→NHWC]", "BatchNorm2d[NHWC→NHWC]", "Residual[NHWC→NHWC]", "ReLU", "Residual[NHWC→NHWC]",
        "AvgPool2d[NHWC→NHWC]", "GlobalAvgPool2d[NHWC→None]", "Linear"]
    model = build(branching_net)
    fuse(model)
    plan_layouts(model)
    assert kinds(model.running_layers) == [
        "Conv2d[NCHW→NHWC]", "ReLU", "ChannelConcat[NHWC→NHWC]", "SqueezeExcite[NHWC→NHWC]",
        "SeparableConv2d[NHWC→NHWC]", "BatchNorm2d[NHWC→NHWC]", "Upsample[NHWC→NHWC]", "Convert[NHWC→NCHW]",
        "Flatten", "Linear"]
    model = build(pool_first)
    plan_layouts(model)
    assert kinds(model.running_layers) == [
        "Convert[NCHW→NHWC]", "BatchNorm2d[NHWC→NHWC]", "MaxPool2d[NHWC→NHWC]", "Conv2d[NHWC→NCHW]", "Tanh",
        "Flatten", "Linear"]


def test_a_lone_op_or_a_chain_cut_by_an_unknown_op_is_converted_only_where_it_pays():
    nf.manual_seed(0)
    alone = nf.Sequential(BatchNorm2d(3), ops.Flatten(), ops.Linear(3 * 8 * 8, 5))
    assert plan_layouts(alone) == 0  # two conversions would cost more than BatchNorm's NCHW pass
    cut = nf.Sequential(Conv2d(3, 4, 3, padding=1), ops.Dropout(0.5), Conv2d(4, 4, 3, padding=1), MaxPool2d(2),
                        ops.Flatten(), ops.Linear(4 * 4 * 4, 5))
    plan_layouts(cut)
    # Dropout draws its mask in the layout it is handed: it gets the map as written, and so does Flatten
    assert kinds(cut.running_layers) == ["Conv2d", "Dropout", "Conv2d[NCHW→NHWC]", "MaxPool2d[NHWC→NHWC]",
                                         "Convert[NHWC→NCHW]", "Flatten", "Linear"]


# ---------------------------------------------------------------- hints override
def test_hinted_ops_are_left_alone_and_a_model_that_contradicts_its_hints_runs_as_written():
    nf.manual_seed(0)
    hinted = nf.Sequential(Conv2d(3, 8, 3, padding=1, output_layout="NHWC"), ops.ReLU(), MaxPool2d(2, layout="NHWC"),
                           Conv2d(8, 8, 3, padding=1, layout="NHWC"), ops.Flatten(), ops.Linear(8 * 4 * 4, 5))
    fuse(hinted)
    fused = list(hinted.running_layers)
    assert plan_layouts(hinted) == 0 and hinted.running_layers == fused
    # an NHWC hint followed by an op left at NCHW: the model hands the pool a map it reads otherwise; not ours to fix
    odd = nf.Sequential(Conv2d(3, 8, 3, padding=1, output_layout="NHWC"), MaxPool2d(2), Conv2d(8, 8, 3, padding=1),
                        ops.Flatten())
    assert plan_layouts(odd) == 0 and odd.running_layers == odd.layers
    # a hinted op keeps its layouts in a chain the pass plans around it: left free, this convolution would write
    # NHWC and the BatchNorm and pool after it run there, converted once before Flatten
    mixed = nf.Sequential(Conv2d(3, 8, 3, padding=1), ops.ReLU(), MaxPool2d(2), ConvertLayout("NCHW", "NHWC"),
                          Conv2d(8, 8, 3, padding=1, layout="NHWC", output_layout="NCHW"), BatchNorm2d(8),
                          MaxPool2d(2), ops.Flatten())
    plan_layouts(mixed)
    assert kinds(mixed.running_layers) == ["Conv2d[NCHW→NHWC]", "ReLU", "MaxPool2d[NHWC→NHWC]", "Convert[NHWC→NCHW]",
                                           "ConvertLayout", "Conv2d", "BatchNorm2d", "MaxPool2d", "Flatten"]


def test_the_builders_models_already_run_nhwc_and_get_no_conversion():
    for model in (build(lambda: resnet18(num_classes=10)), build(lambda: neuroflow_cnn(in_channels=3, width=8))):
        fuse(model)
        assert plan_layouts(model) == 0
        assert not any(isinstance(m, (LayoutPlanned, Conversion)) for s in model.modules()
                       if isinstance(s, nf.Sequential) for m in s.running_layers)


# ---------------------------------------------------------------- the same numbers
@pytest.mark.parametrize("name", list(MODELS))
def test_a_planned_model_gives_the_written_models_values_and_gradients(name):
    make = MODELS[name]
    x64, y = batch(dtype=np.float64)
    written, planned = build(make, np.float64), build(make, np.float64)
    fuse(written)
    fuse(planned)
    assert plan_layouts(planned) > 0
    truth = forward_backward(written, x64, y)
    assert_close(forward_backward(planned, x64, y), truth, rtol=1e-12)
    # in float32 as close to the float64 truth as the ops' own backend-parity tolerances
    planned32 = build(make)
    fuse(planned32)
    plan_layouts(planned32)
    got = forward_backward(planned32, x64.astype(np.float32), y)
    assert_close([a.astype(np.float64) for a in got], truth, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["spec cnn", "residual"])
def test_a_planned_model_passes_the_float64_gradient_check(name):
    model = build(MODELS[name], np.float64).eval()  # eval: finite differences need a forward without side effects
    fuse(model)
    assert plan_layouts(model) > 0
    x, _ = batch(2, np.float64)
    gradcheck(model, x, max_checks=24)


def train(model: nf.Operator, x: np.ndarray, y: np.ndarray, steps: int = 2) -> nf.Trainer:
    trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=len(x), progress=False, seed=0)
    for _ in range(steps):
        trainer.train_step(x, y)
    return trainer


@pytest.mark.parametrize("name", ["spec cnn", "residual"])
def test_the_trainer_plans_and_its_steps_match_the_unplanned_trainers(name, monkeypatch):
    x64, y = batch(8, np.float64)
    planned = train(build(MODELS[name], np.float64), x64, y)
    assert any(isinstance(layer, LayoutPlanned) for layer in planned.model.running_layers)
    monkeypatch.setattr(neuroflow.trainer.session, "plan_layouts", lambda model: 0)
    written = train(build(MODELS[name], np.float64), x64, y)
    assert not any(isinstance(layer, LayoutPlanned) for layer in written.model.running_layers)
    truth = [p.data.copy() for p in written.model.parameters()]
    assert_close([p.data for p in planned.model.parameters()], truth, rtol=1e-12)
    monkeypatch.undo()
    planned32 = train(build(MODELS[name]), x64.astype(np.float32), y)
    assert_close([p.data.astype(np.float64) for p in planned32.model.parameters()], truth, rtol=1e-4, atol=1e-5)


def test_every_backend_trains_the_planned_model_as_the_unplanned_one(nf_backend_name, monkeypatch):
    x, y = batch(8)
    runs = []
    for planned in (True, False):
        if not planned:
            monkeypatch.setattr(neuroflow.trainer.session, "plan_layouts", lambda model: 0)
        trainer = nf.Trainer(build(residual_net), optimizer=nf.optim.SGD(lr=0.05), batch_size=8, progress=False,
                             seed=0, device=nf_backend_name)
        losses = [trainer.train_step(x, y) for _ in range(2)]
        assert isinstance(trainer.model.running_layers[0], LayoutPlanned) == planned
        runs.append((losses, [trainer.backend.to_host(p.data) for p in trainer.model.parameters()]))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-5)
    assert_close(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the model the user sees
def test_the_model_keeps_its_public_face(tmp_path):
    model = build(spec_cnn)
    fresh = build(spec_cnn)
    face = (repr(model), [layer.get_config() for layer in model], [(n, p.shape) for n, p in model.named_parameters()],
            list(model.state_dict()))
    x, y = batch(8)
    trainer = train(model, x, y)
    assert isinstance(model.running_layers[0], LayoutPlanned)
    assert (repr(model), [layer.get_config() for layer in model], [(n, p.shape) for n, p in model.named_parameters()],
            list(model.state_dict())) == face
    assert all(layer.layout == "NCHW" for layer in model if hasattr(layer, "layout"))  # only during each call
    # PyTorch's layout: weights load into the model as written, which gives the same logits on NCHW input
    fresh.load_state_dict({k: np.array(v) for k, v in model.state_dict().items()})
    out = model.forward(x)
    assert out.shape == (8, 5)
    np.testing.assert_array_equal(out, fresh.forward(x))
    assert trainer.predict(x).shape == (8, 5)
    nf.save(model, tmp_path / "cnn.safetensors")
    loaded = nf.load(tmp_path / "cnn.safetensors")
    assert repr(loaded) == face[0] and not isinstance(loaded.running_layers[0], LayoutPlanned)
    train(loaded, x, y, steps=1)
    assert kinds(loaded.running_layers) == kinds(model.running_layers)  # planned again, the same way


def test_a_pytorch_state_dict_trains_as_in_pytorch():
    """PyTorch's names, shapes and order (the linear layer's columns (c, h, w)): one SGD step from the same
    weights lands where PyTorch's does."""
    torch = pytest.importorskip("torch")
    twin = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 2 * 2, 5)).double()
    model = build(spec_cnn, np.float64)
    model.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    x, y = batch(8, np.float64)
    trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.1), batch_size=8, progress=False, seed=0)
    loss = trainer.train_step(x, y)
    assert isinstance(model.running_layers[0], LayoutPlanned)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    expected = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
    expected.backward()
    optimizer.step()
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    for name, value in twin.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value.numpy(), rtol=0, atol=1e-12, err_msg=name)


def test_onnx_export_of_a_planned_model_is_the_written_models(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from neuroflow.export import to_onnx

    model = build(spec_cnn)
    x, y = batch(8)
    train(model, x, y)
    to_onnx(model, tmp_path / "planned.onnx", (1, 3, 8, 8))
    written = build(spec_cnn)
    written.load_state_dict({k: np.array(v) for k, v in model.state_dict().items()})
    to_onnx(written, tmp_path / "written.onnx", (1, 3, 8, 8))
    graphs = [onnx.load(str(tmp_path / f"{name}.onnx")).graph for name in ("planned", "written")]
    assert [n.op_type for n in graphs[0].node] == [n.op_type for n in graphs[1].node]
    assert "Transpose" not in [n.op_type for n in graphs[0].node]


def test_a_sequential_changed_after_planning_runs_its_layers_as_they_are():
    model = build(spec_cnn)
    fuse(model)
    plan_layouts(model)
    model.layers[1] = ops.Tanh()
    assert model.running_layers is model.layers
    x, _ = batch()
    assert model.forward(x).shape == (4, 5)


def test_planning_twice_plans_the_same():
    model = build(residual_net)
    fuse(model)
    plan_layouts(model)
    first = kinds(model.running_layers)
    plan_layouts(model)
    assert kinds(model.running_layers) == first


# ---------------------------------------------------------------- memory and checkpoints
def test_the_profile_plans_what_trains_and_the_spec_cnn_plans_as_the_hinted_model():
    x, y = batch(16)
    hinted = nf.Sequential(Conv2d(3, 8, 3, padding=1, output_layout="NHWC"), ops.ReLU(), MaxPool2d(2, layout="NHWC"),
                           Conv2d(8, 16, 3, padding=1, layout="NHWC"), ops.ReLU(), MaxPool2d(2, layout="NHWC"),
                           ops.Flatten(), ops.Linear(16 * 2 * 2, 5))
    def buffers(plan):
        return [(type(s.owner).__name__, s.key, s.nbytes, s.start, s.end) for s in plan.slots]

    arenas = {}
    for name, make in (("written", spec_cnn), ("hinted", lambda: hinted)):
        predicted = nf.memory.profile(build(make), x.shape, optimizer=nf.optim.SGD(lr=0.05, momentum=0.9))
        trainer = train(build(make), x, y, steps=1)
        assert buffers(predicted.plan) == buffers(trainer.memory.plan)  # every buffer, its size and its lifetime
        arenas[name] = trainer.memory.plan.arena_bytes
        assert ("ConvertLayout" in {owner for owner, *_ in buffers(predicted.plan)}) == (name == "written")
    # the conversion before Flatten is small and dies before the step's peak
    assert arenas["written"] == arenas["hinted"]


def test_profiling_a_model_in_training_keeps_its_steps_in_the_planned_arena():
    """The profile plans the model again before it traces: the conversions must stay the buffer owners the
    trainer's arena was planned for, or the next steps allocate them anew."""
    x, y = batch(8)
    trainer = train(build(spec_cnn), x, y)
    before = trainer.memory_stats().allocations
    nf.memory.profile(trainer.model, x.shape)
    trainer.train_step(x, y)
    assert trainer.memory_stats().allocations == before
    assert isinstance(trainer.model.running_layers[4], Conversion)


def test_a_resumed_run_of_a_planned_model_ends_where_a_straight_run_ends(tmp_path):
    x, y = batch(16)
    straight = nf.Trainer(build(residual_net), optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8, seed=3,
                          progress=False)
    straight.fit((x, y), epochs=2)
    first = nf.Trainer(build(residual_net), optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8, seed=3,
                       progress=False, checkpoint_dir=tmp_path, checkpoint_every=1)
    first.fit((x, y), epochs=1)
    del first  # a new process would resume: the directory is free
    resumed = nf.Trainer(build(residual_net, seed=9), optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8,
                         seed=3, progress=False, checkpoint_dir=tmp_path)
    assert resumed.resume().step == 2
    resumed.fit((x, y), epochs=2)
    assert isinstance(resumed.model.running_layers[0], LayoutPlanned)
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        np.testing.assert_array_equal(a, b)
