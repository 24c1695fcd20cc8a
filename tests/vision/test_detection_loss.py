"""DetectionLoss: the value against direct formulas and YOLOv5's torch twin, the gradient against float64 finite
differences (alpha and the objectness target held) and torch autograd, float32 against float64, duplicates,
empty images, scaling, the model side and every bad input."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import numpy as np
import pytest

from neuroflow.errors import ConfigError, ShapeError
from neuroflow_ops_vision.detection.assignment import assign_targets
from neuroflow_ops_vision.detection.boxes import decode
from neuroflow_ops_vision.detection.loss import DetectionLoss
from neuroflow_ops_vision.detection.targets import pad_targets

from .detection_loss_reference import (
    ANCHORS,
    STRIDE,
    bce,
    numeric_gradient,
    random_output,
    random_targets,
    reference_assignment,
    reference_ciou,
    reference_loss,
    sigmoid,
)


def loss_and_gradient(pred, targets, num_classes, scale=1.0, **kwargs):
    loss = DetectionLoss(ANCHORS, STRIDE, num_classes, **kwargs)
    value = loss.forward(pred, targets)
    return loss, value, np.array(loss.backward(scale), copy=True)


# ---------------------------------------------------------------------- value and gradient
@pytest.mark.parametrize("seed", range(3))
def test_value_matches_the_direct_formulas(seed):
    rng = np.random.default_rng(seed)
    targets = random_targets(rng, 2, 4, 3, 32, empty_images=(1,) if seed == 1 else ())
    pred = random_output(rng, 2, 3, 4, 4)
    loss = DetectionLoss(ANCHORS, STRIDE, 3)
    assert loss.forward(pred, targets) == pytest.approx(reference_loss(pred, targets, 3)[0], rel=1e-12)
    assert set(loss.components) == {"box", "obj", "cls"}


def _check_gradient(pred, targets, num_classes, scale=0.7, max_checks=None, seed=0, **kwargs):
    loss, value, analytic = loss_and_gradient(pred, targets, num_classes, scale, **kwargs)
    options = {"gains": loss.gains, "smoothing": loss.label_smoothing, "factor": len(pred) if loss.batch_scaled else 1}
    expected, frozen = reference_loss(pred, targets, num_classes, **options)
    assert value == pytest.approx(expected, rel=1e-12)
    rng = np.random.default_rng(seed)
    picks = np.arange(pred.size) if max_checks is None else rng.choice(pred.size, max_checks, replace=False)
    # the entries' own channels first: the positives are where the box and class terms live
    raw_index = np.arange(pred.size).reshape(pred.shape[0], len(ANCHORS), 5 + num_classes, *pred.shape[2:])
    entries = reference_assignment(targets, ANCHORS, STRIDE, pred.shape[2], pred.shape[3])
    positives = [raw_index[b, a, :, r, c] for b, a, r, c, *_ in entries]
    picks = np.unique(np.concatenate([picks, *positives]).astype(int))
    numeric = numeric_gradient(lambda p: scale * reference_loss(p, targets, num_classes, frozen=frozen, **options)[0],
                               pred.copy(), picks)
    np.testing.assert_allclose(analytic.reshape(-1)[picks], numeric[picks], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_gradient_matches_finite_differences_in_float64(seed):
    rng = np.random.default_rng(10 + seed)
    targets = random_targets(rng, 2, 4, 3, 32, empty_images=(0,) if seed == 3 else ())
    _check_gradient(random_output(rng, 2, 3, 4, 4), targets, 3, max_checks=60, seed=seed)


def test_gradient_with_boxes_on_cell_borders_one_class_and_smoothing():
    centres = [(0.3, 2.0), (1.49, 1.51), (2.51, 0.49), (3.9, 3.1)]
    rows = [[0, max(x * 8 - 5, 0), max(y * 8 - 6, 0), min(x * 8 + 5, 32), min(y * 8 + 6, 32)] for x, y in centres]
    targets = np.array([rows, [[-1, 0, 0, 0, 0]] * 4])
    rng = np.random.default_rng(7)
    _check_gradient(random_output(rng, 2, 1, 4, 4), targets, 1, max_checks=40)
    _check_gradient(random_output(rng, 2, 2, 4, 4), targets, 2, max_checks=40, label_smoothing=0.1,
                    image_size=32, batch_scaled=True)


def test_duplicates_on_one_slot_count_twice_and_the_later_box_sets_objectness():
    # two boxes centred in cell (1, 1) whose shapes both fit anchor 0 only: every entry of the second box lands
    # on a slot of the first's
    targets = np.array([[[0, 9, 9, 19, 21], [1, 10, 8, 22, 20], [-1, 0, 0, 0, 0]]], dtype=np.float64)
    rng = np.random.default_rng(5)
    pred = random_output(rng, 1, 2, 4, 4)
    assignment = assign_targets(targets, ANCHORS, STRIDE, 4, 4)
    slots, _, last = assignment.cells(len(ANCHORS), 4, 4)
    assert len(slots) < assignment.count  # duplicates exist
    _check_gradient(pred, targets, 2)
    loss, _, grad = loss_and_gradient(pred, targets, 2)
    raw = pred.reshape(1, 3, 7, 4, 4)
    view = grad.reshape(1, 3, 7, 4, 4)
    s = sigmoid(raw[:, :, :4][0, assignment.anchor, :, assignment.row, assignment.col])
    decoded = np.column_stack([2 * s[:, :2] - 0.5, (2 * s[:, 2:]) ** 2 * assignment.anchor_wh])
    overlap = reference_ciou(decoded, assignment.box)[0]
    for slot, entry in zip(slots, last):
        a, rest = divmod(int(slot), 16)
        r, c = divmod(rest, 4)
        assert entry == max(i for i in range(assignment.count) if (assignment.anchor[i], assignment.row[i],
                                                                    assignment.col[i]) == (a, r, c))
        wanted = max(overlap[entry], 0.0)
        np.testing.assert_allclose(view[0, a, 4, r, c], loss.gains[1] * (sigmoid(raw[0, a, 4, r, c]) - wanted) / 48)


def test_images_without_objects_give_the_objectness_term_alone():
    rng = np.random.default_rng(2)
    pred = random_output(rng, 3, 4, 4, 4)
    targets = np.full((3, 2, 5), 0.0)
    targets[:, :, 0] = -1
    loss, value, grad = loss_and_gradient(pred, targets, 4)
    logits = pred.reshape(3, 3, 9, 4, 4)[:, :, 4]
    assert value == pytest.approx(bce(logits, 0.0).mean(), rel=1e-12)
    assert loss.components["box"] == 0.0 and loss.components["cls"] == 0.0
    view = grad.reshape(3, 3, 9, 4, 4)
    np.testing.assert_allclose(view[:, :, 4], sigmoid(logits) / logits.size, rtol=1e-12)
    assert not np.delete(view, 4, axis=2).any()
    no_rows = np.zeros((3, 0, 5))
    assert DetectionLoss(ANCHORS, STRIDE, 4).forward(pred, no_rows) == pytest.approx(value, rel=1e-12)


def test_scale_and_batch_scaling_multiply_the_gradient():
    rng = np.random.default_rng(4)
    pred, targets = random_output(rng, 2, 3, 4, 4), random_targets(rng, 2, 3, 3, 32)
    _, value, grad = loss_and_gradient(pred, targets, 3)
    _, scaled_value, scaled = loss_and_gradient(pred, targets, 3, scale=0.25, batch_scaled=True)
    assert scaled_value == pytest.approx(2 * value, rel=1e-12)
    np.testing.assert_allclose(scaled, 0.5 * grad, rtol=1e-12, atol=1e-18)


def test_gains_scale_as_yolov5_scales_them_for_image_size_and_classes():
    plain = DetectionLoss(ANCHORS, STRIDE, 10)
    assert plain.gains == (0.05, 1.0, 0.5)
    scaled = DetectionLoss(ANCHORS, STRIDE, 10, box=0.1, image_size=96)
    assert scaled.gains == pytest.approx((0.3, (96 / 640) ** 2 * 3, 0.5 * 10 / 80 * 3))
    rng = np.random.default_rng(6)
    pred, targets = random_output(rng, 1, 10, 12, 12), random_targets(rng, 1, 3, 10, 96)
    value = scaled.forward(pred, targets)
    parts = scaled.components
    assert value == pytest.approx(0.3 * parts["box"] + scaled.gains[1] * parts["obj"] + scaled.gains[2] * parts["cls"])


def test_float32_matches_float64_at_a_realistic_batch():
    rng = np.random.default_rng(8)
    pred = random_output(rng, 16, 15, 12, 12) * 2
    targets = random_targets(rng, 16, 5, 15, 96, empty_images=(3, 9))
    loss = DetectionLoss(ANCHORS, STRIDE, 15, image_size=96)
    value64 = loss.forward(pred, targets)
    grad64 = np.array(loss.backward(), copy=True)
    value32 = loss.forward(pred.astype(np.float32), targets.astype(np.float32))
    grad32 = loss.backward()
    assert grad32.dtype == np.float32
    assert value32 == pytest.approx(value64, rel=1e-6)
    np.testing.assert_allclose(grad32, grad64, rtol=1e-5, atol=1e-6 * np.abs(grad64).max())


def test_the_gradient_buffer_is_reused_and_fully_rewritten():
    rng = np.random.default_rng(9)
    loss = DetectionLoss(ANCHORS, STRIDE, 3)
    first_targets = random_targets(rng, 2, 4, 3, 32)
    empty = np.zeros((2, 4, 5))
    empty[:, :, 0] = -1
    pred = random_output(rng, 2, 3, 4, 4)

    class Pool:
        def __init__(self):
            self.held = {}

        def get(self, owner, key, shape, dtype):
            return self.held.setdefault(key, np.empty(shape, dtype))

    loss.attach_pool(Pool())
    loss.forward(pred, first_targets)
    first = loss.backward()
    loss.forward(pred, empty)
    second = loss.backward()
    assert second is first  # the same buffer, with nothing left over from the first step's positives
    np.testing.assert_array_equal(second, loss_and_gradient(pred, empty, 3)[2])
    with pytest.raises(RuntimeError, match="before forward"):
        loss.backward()


# ---------------------------------------------------------------------- YOLOv5's loss in torch (the model's twin)
@pytest.mark.parametrize("seed", range(3))
def test_value_and_gradient_match_the_torch_twin(seed):
    torch = pytest.importorskip("torch")
    from neuroflow_ops_vision.models.torch_yolo_twin import torch_yolo_loss

    rng = np.random.default_rng(20 + seed)
    num_classes = 5
    pred = random_output(rng, 4, num_classes, 6, 6) * 1.5
    targets = random_targets(rng, 4, 5, num_classes, 48, empty_images=(2,))
    targets[0, 0], targets[0, 1] = [1, 9, 9, 19, 21], [2, 10, 8, 22, 20]  # the second on the first one's slots
    targets[1, 0] = [1, 12, 9, 20, 19]  # centred on a cell edge
    loss, value, grad = loss_and_gradient(pred, targets, num_classes, image_size=48)
    tensor = torch.tensor(pred, requires_grad=True)
    box, obj, cls = loss.gains
    expected, parts = torch_yolo_loss(tensor, targets, ANCHORS, STRIDE, num_classes, box=box, obj=obj, cls=cls)
    expected.backward()
    assert value == pytest.approx(float(expected.detach()), rel=1e-12)
    np.testing.assert_allclose([loss.components[k] for k in ("box", "obj", "cls")], parts.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad, tensor.grad.numpy(), rtol=1e-9, atol=1e-15)


# ---------------------------------------------------------------------- the model side
def test_for_model_predictions_and_config_round_trip():
    model = SimpleNamespace(anchors=np.asarray(ANCHORS, np.float32), stride=STRIDE, num_classes=4, image_size=32)
    loss = DetectionLoss.for_model(model, cls=0.25)
    assert loss.image_size == 32 and loss.num_classes == 4 and loss.cls == 0.25
    config = loss.get_config()
    rebuilt = DetectionLoss(**config)
    assert rebuilt.get_config() == config and rebuilt.gains == loss.gains
    unscaled = DetectionLoss.for_model(model, scale_gains=False)
    assert unscaled.gains == (0.05, 1.0, 0.5) and unscaled.image_size is None
    built = inspect.signature(DetectionLoss).parameters
    for name, parameter in inspect.signature(DetectionLoss.for_model).parameters.items():
        if name in built:
            assert parameter.default == built[name].default, name
    rng = np.random.default_rng(1)
    out = random_output(rng, 2, 4, 4, 4).astype(np.float32)
    np.testing.assert_array_equal(loss.predictions(out), decode(out, ANCHORS, STRIDE))
    assert loss.predictions(out).shape == (2, 3 * 16, 9)


def test_the_evaluator_is_the_detectors_map_for_these_anchors():
    from neuroflow_ops_vision.detection.evaluation import DetectionEvaluator

    evaluator = DetectionLoss(ANCHORS, STRIDE, 3).evaluator()
    assert isinstance(evaluator, DetectionEvaluator)
    np.testing.assert_allclose(evaluator.anchors, ANCHORS)
    assert (evaluator.stride, evaluator.num_classes) == (STRIDE, 3)
    # a head that puts one confident box of class 1 exactly on the ground truth: mAP 1
    out = np.full((1, 24, 4, 4), -12.0, np.float32)
    out[0, 8 + 0:8 + 4, 1, 2] = 0.0  # anchor 1, cell (y 1, x 2): centre (2.5, 1.5) cells, w, h = anchor
    out[0, 8 + 4, 1, 2] = out[0, 8 + 5 + 1, 1, 2] = 12.0
    targets = np.array([[[1, 12, 0, 28, 27]]], np.float32)  # that box, (12, -3, 28, 27), clipped to the image
    evaluator.add(out, targets)
    assert evaluator.result()["mAP@0.5"] > 0.99


def test_for_the_yolo_lite_model():
    from neuroflow_ops_vision.detection.model import yolo_lite

    model = yolo_lite(num_classes=3, image_size=32)
    loss = DetectionLoss.for_model(model)
    np.testing.assert_allclose(loss.anchors, model.anchors)
    out = model.forward(np.random.default_rng(0).random((2, 1, 32, 32), dtype=np.float32))
    targets = np.array([[[0, 2, 3, 20, 30]], [[-1, 0, 0, 0, 0]]], np.float32)
    assert math.isfinite(loss.forward(out, targets))
    assert loss.backward().shape == out.shape


def test_for_model_refuses_a_model_that_is_not_a_detector():
    import neuroflow as nf

    classifier = nf.Sequential(nf.ops.Linear(784, 128), nf.ops.Linear(128, 10))  # an MNIST MLP
    with pytest.raises(ConfigError, match=r"model \(Sequential\) is not a detector: it has no anchors, stride, "
                                          r"num_classes; for_model expects a detector .* yolo_lite"):
        DetectionLoss.for_model(classifier)


def test_per_image_targets_are_padded_as_the_dataloader_pads_them():
    per_image = [np.array([[0, 2, 3, 20, 30], [2, 1, 1, 9, 9]], np.float32), np.zeros((0, 5), np.float32),
                 np.array([[1, 4, 4, 12, 14]], np.float32)]  # digit_canvases' form: k differs per image
    pred = random_output(np.random.default_rng(2), 3, 3, 4, 4)
    padded = DetectionLoss(ANCHORS, STRIDE, 3).forward(pred, pad_targets(per_image, 2))
    assert DetectionLoss(ANCHORS, STRIDE, 3).forward(pred, per_image) == padded
    with pytest.raises(ValueError, match="image 2, row 0: class id 7 is out of range"):
        DetectionLoss(ANCHORS, STRIDE, 3).forward(pred, [*per_image[:2], np.array([[7, 4, 4, 12, 14]])])


def test_a_bad_class_in_a_batch_says_the_image_number_is_its_place_in_the_batch():
    targets = _bad([[0, 1, 1, 9, 9]]).repeat(2, axis=0)
    targets[1, 0, 0] = 5
    with pytest.raises(ValueError, match=r"image 1, row 0: class id 5 is out of range.*its position in this batch, "
                                         r"not its index in the data set; DetectionDataset\(images, targets, "
                                         r"num_classes=3\) checks every image up front"):
        DetectionLoss(ANCHORS, STRIDE, 3).forward(np.zeros((2, 24, 4, 4)), targets)


def test_predictions_refuse_an_output_of_other_classes():
    loss = DetectionLoss(ANCHORS, STRIDE, 3)  # 3 × (5 + 3) = 24 channels; 27 would decode as 4 classes
    with pytest.raises(ShapeError, match=r"decode got 27 channels; expected 24 = 3 anchors × \(5 \+ 3 classes\)"):
        loss.predictions(np.zeros((1, 27, 4, 4)))


# ---------------------------------------------------------------------- bad input
def _bad(rows):
    targets = np.zeros((1, 2, 5))
    targets[0, :, 0] = -1
    targets[0, : len(rows)] = rows
    return targets


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (_bad([[3, 1, 1, 9, 9]]), r"class id 3 is out of range; class ids are integers in \[0, 3\)"),
        (_bad([[-2, 1, 1, 9, 9]]), "class id -2 is out of range"),
        (_bad([[1.5, 1, 1, 9, 9]]), "class id 1.5 is out of range"),
        (_bad([[0, -1, 1, 9, 9]]), r"box \(-1, 1, 9, 9\) lies outside the 32×32 image"),
        (_bad([[0, 1, 1, 9, 33]]), "lies outside the 32×32 image"),
        (_bad([[0, 4, 1, 4, 9]]), "zero or negative area"),
        (_bad([[0, 1, 1, np.nan, 9]]), "NaN or Inf"),
    ],
)
def test_bad_targets_are_refused_naming_the_row(targets, message):
    pred = np.zeros((1, 24, 4, 4))
    with pytest.raises(ValueError, match=message):
        DetectionLoss(ANCHORS, STRIDE, 3).forward(pred, targets)


@pytest.mark.parametrize(
    ("pred_shape", "target_shape", "message"),
    [
        ((2, 24, 4, 4), (3, 2, 5), "output for 2 images and targets for 3"),
        ((2, 25, 4, 4), (2, 2, 5), r"expected \(batch, 24, H, W\): 3 anchors × \(5 \+ 3 classes\)"),
        ((2, 24, 16), (2, 2, 5), r"output of shape \(2, 24, 16\)"),
        ((2, 24, 4, 4), (2, 2, 4), r"targets of shape \(2, 2, 4\); expected \(batch, max_objects, 5\)"),
    ],
)
def test_mismatched_shapes_are_refused(pred_shape, target_shape, message):
    targets = np.zeros(target_shape)
    targets[..., 0] = -1
    with pytest.raises(ShapeError, match=message):
        DetectionLoss(ANCHORS, STRIDE, 3).forward(np.zeros(pred_shape), targets)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"anchors": [[10, 13, 1]]}, r"anchors has shape \(1, 3\)"),
        ({"anchors": [[10, -1]]}, "positive and finite"),
        ({"stride": 0}, "stride must be a positive integer"),
        ({"num_classes": 2.5}, "num_classes must be a positive integer"),
        ({"anchor_t": 1.0}, "anchor_t must be a finite number > 1"),
        ({"obj": -1.0}, "the obj gain must be"),
        ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
        ({"image_size": 0}, "image_size must be a positive integer"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    arguments = {"anchors": ANCHORS, "stride": STRIDE, "num_classes": 3, **kwargs}
    with pytest.raises(ConfigError, match=message):
        DetectionLoss(**arguments)


def test_training_the_yolo_lite_model_lowers_the_loss_on_planned_buffers():
    import neuroflow as nf
    from neuroflow_ops_vision.detection.model import yolo_lite

    model = yolo_lite(num_classes=3, image_size=32, width=0.25)
    loss = DetectionLoss.for_model(model)
    trainer = nf.Trainer(model, loss=loss, optimizer=nf.optim.AdamW(lr=3e-3), batch_size=4, progress=False, seed=0)
    x = np.random.default_rng(0).random((4, 1, 32, 32), dtype=np.float32)
    y = np.zeros((4, 2, 5), np.float32)
    y[:, :, 0] = -1
    y[0, 0], y[1, 0], y[2, 0], y[2, 1] = [0, 2, 3, 20, 30], [1, 10, 10, 26, 22], [2, 4, 4, 16, 16], [0, 16, 16, 30, 31]
    first = trainer.train_step(x, y)
    trainer.train_step(x, y)
    allocations = trainer.memory_stats().allocations
    values = [trainer.train_step(x, y) for _ in range(12)]
    assert trainer.memory_stats().allocations == allocations  # a planned step allocates nothing new
    assert loss.buffer_pool is not None
    assert values[-1] < 0.7 * first


def test_every_backend_gives_the_cpu_value_and_gradient(nf_backend):
    rng = np.random.default_rng(11)
    pred = random_output(rng, 4, 3, 6, 6).astype(np.float32)
    targets = random_targets(rng, 4, 4, 3, 48, empty_images=(1,)).astype(np.float32)
    _, value, grad = loss_and_gradient(pred, targets, 3)
    loss = DetectionLoss(ANCHORS, STRIDE, 3).to(nf_backend)
    got = loss.forward(nf_backend.from_host(pred), nf_backend.from_host(targets))
    assert got == pytest.approx(value, rel=1e-5)
    np.testing.assert_allclose(nf_backend.to_host(loss.backward()), grad, rtol=1e-4, atol=1e-7)
