"""NeuroFlow-YOLO-lite: structure, head priors, gradients, bad arguments, save/load (float and INT8), ONNX, the
memory plan, the layout pass, and its PyTorch twin (model and YOLOv5 loss)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import registry
from neuroflow.checkpoint.errors import CheckpointError
from neuroflow.errors import ShapeError
from neuroflow.fusion import fuse
from neuroflow.layout_pass import plan_layouts
from neuroflow.testing import gradcheck
from neuroflow_ops_vision import BatchNorm2d
from neuroflow_ops_vision.detection.loss import DetectionLoss
from neuroflow_ops_vision.detection.model import DEFAULT_ANCHORS, YoloLite, yolo_lite

from .step_memory import measure_steps


def tiny(dtype: type = np.float64) -> YoloLite:
    """Two classes on 32-px canvases at an eighth of the width: every layer, 5,241 parameters."""
    nf.manual_seed(0)
    return yolo_lite(num_classes=2, image_size=32, width=0.125, dtype=dtype)


def canvases(n: int, size: int = 96, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, size, size)).astype(np.float32)


def settle_statistics(model: YoloLite, x: np.ndarray) -> YoloLite:
    """A few training-mode forwards, so the running statistics differ from their 0/1 start; then eval mode."""
    for _ in range(3):
        model.forward(x)
    return model.eval()


# ---------------------------------------------------------------------------------------------- structure
def test_default_model_shapes_names_and_attributes(rng: np.random.Generator) -> None:
    nf.manual_seed(0)
    model = yolo_lite()
    assert sum(p.data.size for p in model.parameters()) == 230_349
    assert model.num_classes == 10 and model.stride == 8
    assert model.anchors.dtype == np.float32
    np.testing.assert_array_equal(model.anchors, np.array(DEFAULT_ANCHORS, np.float32))
    names = [name for name, _ in model.named_parameters()]
    assert names[:3] == ["stage1.0.weight", "stage1.1.weight", "stage1.1.bias"]
    assert "neck.1.0.0.depthwise.weight" in names and "neck.1.1.fc1.weight" in names
    assert names[-2:] == ["head.2.weight", "head.2.bias"]
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"SeparableConv2d", "SqueezeExcite", "Upsample", "ChannelConcat", "BatchNorm2d"} <= kinds
    x = canvases(2)
    y = model.forward(x)
    assert y.shape == (2, 45, 12, 12) == model.output_shape(x.shape)
    assert model.backward(np.ones_like(y)).shape == x.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    assert model.output_shape((1, 1, 128, 160)) == (1, 45, 16, 20)


def test_options_change_the_layers() -> None:
    model = yolo_lite(num_classes=3, anchors=[[10, 12], [20, 22], [30, 40]], image_size=64, in_channels=3, width=0.5)
    assert model.stage1[0].weight.shape == (16, 3, 3, 3)
    assert model.head[2].weight.shape == (24, 64, 1, 1)
    assert model.forward(canvases(1, 64).repeat(3, axis=1)).shape == (1, 24, 8, 8)
    np.testing.assert_array_equal(model.anchors, [[10, 12], [20, 22], [30, 40]])


def test_head_biases_start_at_yolov5s_priors() -> None:
    """Objectness at about 8 objects per image over the grid's cells, classes at 0.6/(C − 0.99), on top of the
    convolution's own uniform(±1/√fan_in) start."""
    nf.manual_seed(0)
    model = yolo_lite(num_classes=10)
    bias = model.head[2].bias.data.reshape(3, 15)
    bound = 1 / math.sqrt(128)
    assert np.all(np.abs(bias[:, 4] - math.log(8 / 144)) <= bound)
    assert np.all(np.abs(bias[:, 5:] - math.log(0.6 / 9.01)) <= bound)
    assert np.all(np.abs(bias[:, :4]) <= bound)


def test_get_config_rebuilds_it_and_it_is_registered() -> None:
    model = yolo_lite(num_classes=4, anchors=[[8, 8], [16, 16], [32, 24]], image_size=48, width=0.25)
    rebuilt = YoloLite(**model.get_config())
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [(n, p.shape) for n, p in model.named_parameters()]
    np.testing.assert_array_equal(rebuilt.anchors, model.anchors)
    assert registry.models.get("yolo_lite") is yolo_lite
    assert registry.models.distribution("yolo_lite") == "neuroflow-ops-vision"
    assert registry.ops.get("YoloLite") is YoloLite
    assert repr(model).startswith("YoloLite(classes=4, anchors=[8×8, 16×16, 32×24], stride=8,\n  (stage1): ")


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(anchors=[[10, 10], [20, 20]]), r"anchors has shape \(2, 2\); the head predicts 3 anchors"),
    (dict(anchors=np.ones((4, 2))), r"anchors has shape \(4, 2\); the head predicts 3 anchors"),
    (dict(anchors=[10, 20, 30]), r"anchors has shape \(3,\)"),
    (dict(anchors=[[10, 10], [0, 20], [30, 30]]), "anchor sizes must be positive and finite"),
    (dict(anchors=[[10, 10], [np.nan, 20], [30, 30]]), "anchor sizes must be positive and finite"),
    (dict(anchors="big"), "anchors must be 3 \\(w, h\\) pairs"),
    (dict(num_classes=0), "num_classes must be a positive int; got 0"),
    (dict(num_classes=2.5), "num_classes must be a positive int; got 2.5"),
    (dict(num_classes=True), "num_classes must be a positive int; got True"),
    (dict(in_channels=0), "in_channels must be a positive int"),
    (dict(image_size=90), "image_size=90 is not a multiple of 16.*use e.g. 80"),
    (dict(image_size=8), "image_size=8 is not a multiple of 16.*use e.g. 16"),
    (dict(width=0), r"width must be a multiplier in \(0, 8\]; got 0"),
    (dict(anchors=[[1e308, 10], [10, 10], [10, 10]]), "anchor sizes must be positive and finite in float32"),
    (dict(anchors=[[1e-50, 10], [10, 10], [10, 10]]), "anchor sizes must be positive and finite in float32"),
    (dict(image_size=4112), "image_size=4112 is above 4096, the largest side it takes"),
])
def test_bad_arguments_are_refused_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        yolo_lite(**kwargs)


def test_a_model_file_asking_for_a_huge_canvas_is_refused_when_loaded(tmp_path) -> None:
    model = tiny()
    config = model.get_config()
    model.get_config = lambda: {**config, "image_size": 64000}  # what a hostile file says
    nf.save(model, tmp_path / "hostile.nf")
    with pytest.raises(CheckpointError, match="image_size=64000 is above 4096"):
        nf.load(tmp_path / "hostile.nf")


def test_bad_inputs_name_the_shape() -> None:
    model = tiny(np.float32)
    with pytest.raises(ShapeError, match=r"YoloLite\(classes=2, in_channels=1\) got input of shape \(1, 3, 32, 32\); expected \(N, 1, H, W\)"):
        model.forward(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(ShapeError, match=r"got input of shape \(1, 1, 40, 32\); H and W must be multiples of 16"):
        model.forward(np.zeros((1, 1, 40, 32), np.float32))
    with pytest.raises(ShapeError, match="multiples of 16"):
        model.output_shape((1, 1, 32, 24))


# ---------------------------------------------------------------------------------------------- gradients
def randomize_batchnorm(model: YoloLite, seed: int = 0) -> YoloLite:
    """Running statistics and affine parameters away from their 0/1 start. In eval mode a BatchNorm with bias 0
    and mean 0 maps an all-zero window (a bias-free convolution of ReLU zeros) to exactly 0, where the next ReLU
    has its kink: central differences there are not the gradient."""
    rng = np.random.default_rng(seed)
    for op in model.modules():
        if isinstance(op, BatchNorm2d):
            c = op.num_features
            op.running_mean.data[...] = rng.normal(0, 0.1, c)
            op.running_var.data[...] = rng.uniform(0.5, 1.5, c)
            op.weight.data[...] = rng.uniform(0.5, 1.5, c)
            op.bias.data[...] = rng.normal(0, 0.1, c)
    return model


@pytest.mark.parametrize("training", [True, False])
def test_whole_model_gradcheck_including_the_neck_branch(training: bool, rng: np.random.Generator) -> None:
    """Every parameter of every layer (the upsampled, squeeze-excited branch of the concat too) against central
    differences, in float64, with batch statistics (training) and with running ones (eval)."""
    model = randomize_batchnorm(tiny()).train(training)
    gradcheck(model, rng.random((2, 1, 32, 32)), max_checks=12, atol=1e-5, rtol=1e-4)


def test_float32_follows_float64(rng: np.random.Generator) -> None:
    x = canvases(4)
    nf.manual_seed(0)
    single = yolo_lite()
    double = YoloLite(**single.get_config(), dtype=np.float64)
    double.load_state_dict({k: np.asarray(v, np.float64) for k, v in single.state_dict().items()})
    y32, y64 = single.forward(x), double.forward(x.astype(np.float64))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=0, atol=1e-5 * np.abs(y64).max())
    g = rng.standard_normal(y32.shape)
    single.backward(g.astype(np.float32))
    double.backward(g)
    for (name, a), (_, b) in zip(single.named_parameters(), double.named_parameters(), strict=True):
        np.testing.assert_allclose(a.grad, b.grad, rtol=0, atol=1e-4 * np.abs(b.grad).max(), err_msg=name)


# ---------------------------------------------------------------------------------------------- deploy
def test_save_and_load_float_and_int8(tmp_path) -> None:
    nf.manual_seed(0)
    x = canvases(4)
    model = settle_statistics(yolo_lite(anchors=[[14, 20], [24, 30], [36, 44]]), x)
    want = model.forward(x)
    nf.save(model, tmp_path / "float.nf")
    report = nf.save(model, tmp_path / "int8.nf", quantize="int8")
    assert (tmp_path / "int8.nf").stat().st_size < 0.3 * (tmp_path / "float.nf").stat().st_size
    assert report.quantization is not None
    for name in ("float.nf", "int8.nf"):
        loaded = nf.load(tmp_path / name)
        assert isinstance(loaded, YoloLite) and loaded.stride == 8 and loaded.num_classes == 10
        np.testing.assert_array_equal(loaded.anchors, model.anchors)
        got = loaded.eval().forward(x)
        if name == "float.nf":
            np.testing.assert_array_equal(got, want)
        else:  # measured: 3.2e-4 of the largest output (random weights, per-channel INT8 steps of max|w|/127)
            assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()


def test_onnx_export_runs_in_onnxruntime(tmp_path) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from neuroflow.export import to_onnx

    nf.manual_seed(0)
    x = canvases(3)
    model = settle_statistics(yolo_lite(), x)
    report = to_onnx(model, tmp_path / "yolo.onnx", (1, 1, 96, 96))
    assert report.output_shape[1:] == (45, 12, 12)
    graph = onnx.load(str(tmp_path / "yolo.onnx")).graph
    kinds = {node.op_type for node in graph.node}
    assert {"Conv", "BatchNormalization", "Relu", "Resize", "Concat", "GlobalAveragePool", "Sigmoid"} <= kinds
    session = ort.InferenceSession(str(tmp_path / "yolo.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, model.forward(x), rtol=0, atol=1e-5 * np.abs(got).max())


# ---------------------------------------------------------------------------------------------- memory plan
def detection_batch(n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Canvases and padded (n, 3, 5) targets: one to three boxes an image."""
    rng = np.random.default_rng(1)
    targets = np.zeros((n, 3, 5), np.float32)
    targets[..., 0] = -1
    for b in range(n):
        for row in range(1 + b % 3):
            w, h = rng.uniform(8, 36, 2)
            x1, y1 = rng.uniform(0, 96 - w), rng.uniform(0, 96 - h)
            targets[b, row] = [rng.integers(0, 10), x1, y1, x1 + w, y1 + h]
    return canvases(n), targets


def seeded() -> YoloLite:
    nf.manual_seed(0)
    return yolo_lite()


def detection_trainer(**options: object) -> nf.Trainer:
    model = seeded()
    return nf.Trainer(model, DetectionLoss.for_model(model), nf.optim.SGD(lr=0.01, momentum=0.9), progress=False,
                      **options)


def test_predicted_peak_matches_the_measured_steady_state_peak() -> None:
    x, y = detection_batch()
    model = seeded()
    report = nf.memory.profile(model, x.shape, DetectionLoss.for_model(model), nf.optim.SGD(lr=0.01, momentum=0.9))
    predicted = report.predicted_peak_bytes
    measured = measure_steps(lambda: detection_trainer(batch_size=8), x, y)
    assert abs(predicted - measured.peak) / measured.peak <= 0.05, (predicted, measured.peak)  # 1.0 % under, batch 8
    assert measured.grown == []


def test_planned_training_matches_unplanned_training_bit_for_bit() -> None:
    """The arena reuses dead buffers (the concat's identity branch hands its input on): none too early."""
    x, y = detection_batch()
    runs = []
    for allocator in ("arena", "direct"):
        trainer = detection_trainer(batch_size=4, seed=1, allocator=allocator)
        trainer.fit((x, y), epochs=2)
        runs.append([p.data.copy() for p in trainer.model.parameters()])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_memory_budget_splits_the_batch_and_the_step_still_trains() -> None:
    x, y = detection_batch()
    model = seeded()
    full = nf.memory.profile(model, x.shape, DetectionLoss.for_model(model), nf.optim.SGD(lr=0.01, momentum=0.9))
    trainer = detection_trainer(batch_size=8, memory_budget_mb=(full.static_bytes + 0.6 * full.arena_bytes) / 2**20)
    losses = [trainer.train_step(x, y) for _ in range(3)]
    assert trainer.memory.batch_size < 8 and trainer.memory.batch_size * trainer.memory.accumulation == 8
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_the_layout_pass_plans_the_model_and_changes_no_number(rng: np.random.Generator) -> None:
    x = canvases(2)
    g = rng.standard_normal((2, 45, 12, 12)).astype(np.float32)
    results = []
    for planned in (False, True):
        model = seeded()
        if planned:
            fuse(model)
            plan_layouts(model)
        out = model.forward(x)
        gx = model.backward(g)
        results.append([out.copy(), gx.copy(), *(p.grad.copy() for p in model.parameters())])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------- PyTorch twin
@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_twin_gives_the_same_outputs_and_gradients_with_copied_weights(dtype: type, tolerance: float) -> None:
    torch = pytest.importorskip("torch")
    from neuroflow_ops_vision.models.torch_yolo_twin import load_neuroflow_weights, torch_yolo_lite

    nf.manual_seed(0)
    model = yolo_lite(dtype=dtype)
    twin = torch_yolo_lite(10).to(torch.float64 if dtype == np.float64 else torch.float32)
    load_neuroflow_weights(twin, model.state_dict())
    assert [n for n, _ in twin.named_parameters()] == [n for n, _ in model.named_parameters()]
    x = canvases(3).astype(dtype)
    for training in (True, False):
        model.train(training)
        twin.train(training)
        want = twin(torch.from_numpy(x))
        got = model.forward(x)
        scale = float(want.detach().abs().max())
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=tolerance * scale)
    g = np.random.default_rng(2).standard_normal(got.shape).astype(dtype)
    model.backward(g)
    want.backward(torch.from_numpy(g))
    grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        reference = grads[name].grad.numpy()
        np.testing.assert_allclose(p.grad, reference, rtol=0, atol=10 * tolerance * np.abs(reference).max(),
                                   err_msg=name)


def padded(rows: list[list[list[float]]], max_objects: int = 4) -> np.ndarray:
    out = np.zeros((len(rows), max_objects, 5), np.float32)
    out[..., 0] = -1
    for b, image in enumerate(rows):
        if image:
            out[b, :len(image)] = image
    return out


def test_torch_loss_assigns_boxes_as_yolov5() -> None:
    """A 16×24 box centred at (52, 21) on a 12×12 grid of stride 8: centre (6.5, 2.625) in cells, 2×3 cells.
    Anchors 18×18 and 28×28 are within ratio 4 of it, 120×120 is not. Neighbours: x's fraction 0.5 is not
    below a half, from either side (12 − 6.5 = 5.5): none; y's 0.625 is not, but from below 12 − 2.625 = 9.375
    has 0.375: the cell below, y = 3 (offset −0.375 from its corner)."""
    torch = pytest.importorskip("torch")
    from neuroflow_ops_vision.models.torch_yolo_twin import torch_build_targets

    anchors = np.array([[18, 18], [28, 28], [120, 120]], np.float32)
    image, anchor, gy, gx, box, cls = torch_build_targets(padded([[], [[7, 44, 9, 60, 33]]]), anchors, 8, (12, 12))
    assert image.tolist() == [1, 1, 1, 1] and cls.tolist() == [7] * 4
    assert anchor.tolist() == [0, 1, 0, 1]
    assert list(zip(gy.tolist(), gx.tolist())) == [(2, 6), (2, 6), (3, 6), (3, 6)]
    np.testing.assert_allclose(box.numpy(), [[0.5, 0.625, 2, 3]] * 2 + [[0.5, -0.375, 2, 3]] * 2)
    empty = torch_build_targets(padded([[], []]), anchors, 8, (12, 12))
    assert all(len(t) == 0 for t in empty)
    assert torch is not None


def test_torch_loss_parts() -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from neuroflow_ops_vision.models.torch_yolo_twin import torch_bbox_ciou, torch_yolo_loss

    boxes = torch.tensor([[5.0, 5.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    np.testing.assert_allclose(torch_bbox_ciou(boxes, boxes).numpy(), [1.0, 1.0], atol=1e-6)
    shifted = torch_bbox_ciou(boxes[:1], torch.tensor([[6.0, 5.0, 2.0, 3.0]], dtype=torch.float64))
    # IoU 1/3 (overlap 3 of 9), centre distance² 1 over the enclosing box's diagonal² 3² + 3²; same aspect: v = 0
    np.testing.assert_allclose(shifted.numpy(), [1 / 3 - 1 / 18], atol=1e-6)

    anchors = np.array(DEFAULT_ANCHORS, np.float32)
    rng = np.random.default_rng(0)
    output = torch.from_numpy(rng.standard_normal((2, 3 * 7, 12, 12))).requires_grad_(True)
    total, (lbox, lobj, lcls) = torch_yolo_loss(output, padded([[], []]), anchors, 8, 2)
    assert lbox == 0 and lcls == 0
    head = output.detach().view(2, 3, 7, 12, 12)[:, :, 4]
    np.testing.assert_allclose(lobj.item(), F.binary_cross_entropy_with_logits(head, torch.zeros_like(head)).item())
    targets = padded([[[0, 10, 12, 40, 50], [1, 50, 50, 90, 70]], [[1, 0, 0, 20, 30]]])
    total, parts = torch_yolo_loss(output, targets, anchors, 8, 2, box=0.05, obj=1.0, cls=0.5)
    assert float(total.detach()) == pytest.approx(float(0.05 * parts[0] + parts[1] + 0.5 * parts[2]))
    assert all(float(p) > 0 for p in parts)
    total.backward()
    assert torch.isfinite(output.grad).all() and output.grad.abs().sum() > 0


def test_detection_loss_through_the_model_matches_the_twin(rng: np.random.Generator) -> None:
    """One float64 training step's loss and every parameter's gradient, NeuroFlow's model and DetectionLoss
    against the twin and the PyTorch YOLOv5 loss with the same (scaled) gains."""
    torch = pytest.importorskip("torch")
    from neuroflow_ops_vision.models.torch_yolo_twin import load_neuroflow_weights, torch_yolo_lite, torch_yolo_loss

    nf.manual_seed(0)
    model = yolo_lite(dtype=np.float64)
    twin = load_neuroflow_weights(torch_yolo_lite(10).double(), model.state_dict())
    loss = DetectionLoss.for_model(model)
    x = canvases(2).astype(np.float64)
    targets = padded([[[3, 10, 12, 40, 50], [7, 50, 50, 90, 70], [1, 60, 8, 84, 40]], [[9, 0, 0, 20, 30]]])
    value = loss.forward(model.forward(x), targets)
    model.backward(loss.backward())
    box, obj, cls = loss.gains
    want, _ = torch_yolo_loss(twin(torch.from_numpy(x)), targets, model.anchors, 8, 10, box=box, obj=obj, cls=cls)
    want.backward()
    assert value == pytest.approx(float(want.detach()), rel=1e-10)
    grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        reference = grads[name].grad.numpy()
        np.testing.assert_allclose(p.grad, reference, rtol=0, atol=1e-9 * np.abs(reference).max(), err_msg=name)
