"""DetectionLoss: YOLOv5's loss for one level (CIoU box, objectness and class BCE) with its explicit gradient.

For a raw head output (B, A·(5+C), H, W) and padded targets (B, M, 5) (see
``targets``), the boxes are assigned to anchors and cells
(:func:`assignment.assign_targets`), then::

    loss = box_gain · l_box + obj_gain · l_obj + cls_gain · l_cls       (× B with batch_scaled=True)
    l_box = mean over the n entries of (1 - CIoU(decoded prediction, box))
    l_obj = mean over all B·A·H·W slots of BCE-with-logits(objectness, t),
            t = max(CIoU, 0) of the slot's last entry (detached), 0 where no entry falls
    l_cls = mean over the n entries × C classes of BCE-with-logits(class logits, one-hot)

The prediction of an entry is decoded as the model's output is
(``boxes.decode``), in grid units relative to its cell:
``x = 2σ(tx) - 0.5``, ``w = (2σ(tw))² · anchor_w``. ``l_box`` and ``l_cls``
are 0 when no box is assigned; ``l_cls`` is 0 for one class (YOLOv5 skips
it). The gradient is the derivative of the value with the objectness target
and CIoU's ``alpha`` held constant, as YOLOv5's autograd computes it.

Where the work runs: the assignment on the host (a few hundred entries), the
objectness BCE on the whole (B, A, H, W) map with the output's array
namespace, and the entries' decode, CIoU and class BCE on the host in
float64 from the (n, 5+C) values gathered for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ConfigError, ShapeError
from neuroflow.losses.base import Loss
from neuroflow_ops_vision.detection.assignment import Assignment, assign_targets
from neuroflow_ops_vision.detection.boxes import decode
from neuroflow_ops_vision.detection.ciou import ciou_with_grad
from neuroflow_ops_vision.detection.evaluation import DetectionEvaluator
from neuroflow_ops_vision.detection.targets import check_targets, pad_targets

#: YOLOv5's reference training size and class count, which its gains are tuned for (``hyp`` scaling in train.py).
REFERENCE_IMAGE_SIZE = 640
REFERENCE_CLASSES = 80
#: YOLOv5's gains scale with 3 / levels; this loss has one level.
_LEVEL_FACTOR = 3.0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


class DetectionLoss(Loss):
    """YOLOv5's detection loss for one level (see the module docstring) with forward and backward.

    ``anchors``: (A, 2) (w, h) in pixels; ``stride``: pixels per cell;
    ``num_classes``: C. ``anchor_t``: the largest box/anchor side ratio an
    anchor takes. ``box``, ``obj``, ``cls``: YOLOv5's gains; with
    ``image_size`` they are scaled as YOLOv5's train.py scales them for the
    image size, the class count and one level (box × 3, cls × C/80 × 3,
    obj × (size/640)² × 3), which keeps each positive's pull what it is at
    YOLOv5's scale; without, they are used as given. ``label_smoothing`` ε:
    class targets 1 - ε/2 and ε/2. ``batch_scaled``: multiply the loss by the
    batch size as YOLOv5 does (the default is the mean, the Loss contract, so
    gradient accumulation adds up). ``forward`` takes padded (B, M, 5)
    targets or a list of per-image (k, 5) arrays (``digit_canvases``' form,
    padded as a DataLoader pads them). After ``forward``, ``components`` holds
    the unweighted ``{"box", "obj", "cls"}`` terms.
    """

    def __init__(self, anchors: Sequence[Sequence[float]] | np.ndarray, stride: int, num_classes: int, *,
                 anchor_t: float = 4.0, box: float = 0.05, obj: float = 1.0, cls: float = 0.5,
                 label_smoothing: float = 0.0, image_size: int | None = None, batch_scaled: bool = False) -> None:
        self.anchors = _check_anchors(anchors)
        self.stride = _positive_int("stride", stride)
        self.num_classes = _positive_int("num_classes", num_classes)
        self.image_size = None if image_size is None else _positive_int("image_size", image_size)
        if not (isinstance(anchor_t, (int, float)) and math.isfinite(anchor_t) and anchor_t > 1.0):
            raise ConfigError(f"DetectionLoss: anchor_t must be a finite number > 1 (a side ratio); got {anchor_t!r}")
        for name, gain in (("box", box), ("obj", obj), ("cls", cls)):
            if not (isinstance(gain, (int, float)) and math.isfinite(gain) and gain >= 0):
                raise ConfigError(f"DetectionLoss: the {name} gain must be a finite number >= 0; got {gain!r}")
        if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing < 1.0):
            raise ConfigError(f"DetectionLoss: label_smoothing must be in [0, 1); got {label_smoothing!r}")
        self.anchor_t, self.label_smoothing, self.batch_scaled = float(anchor_t), float(label_smoothing), bool(batch_scaled)
        self.box, self.obj, self.cls = float(box), float(obj), float(cls)
        self.gains = self._scaled_gains()
        self.components: dict[str, float] = {}
        self._sigmoid: Any = None  # σ(objectness) of every slot, for backward
        self._obj_factor = 0.0
        self._index: Any = None  # (u, 5+C) device offsets into the output of the channels of the slots entries fall on
        self._slot_grad: np.ndarray | None = None  # (u, 5+C) host gradient of those slots' channels, before scale

    @staticmethod
    def for_model(model: Any, *, anchor_t: float = 4.0, box: float = 0.05, obj: float = 1.0, cls: float = 0.5,
                  label_smoothing: float = 0.0, scale_gains: bool = True, batch_scaled: bool = False) -> DetectionLoss:
        """The loss for a detector with ``anchors``, ``stride`` and ``num_classes`` attributes (a config's
        ``[loss] type = "DetectionLoss"``): with ``scale_gains``, the gains are scaled for the model's
        ``image_size`` as YOLOv5 scales them; the other keywords as for the constructor."""
        missing = [name for name in ("anchors", "stride", "num_classes") if not hasattr(model, name)]
        if missing:
            raise ConfigError(
                f"DetectionLoss.for_model: the model ({type(model).__name__}) is not a detector: it has no "
                f"{', '.join(missing)}; for_model expects a detector with anchors, stride and num_classes "
                "attributes (e.g. yolo_lite(num_classes=10)); check that the model file matches the config, "
                "or give a classifier a classification loss ([loss] type = \"CrossEntropy\")"
            )
        image_size = getattr(model, "image_size", None) if scale_gains else None
        return DetectionLoss(model.anchors, model.stride, model.num_classes, anchor_t=anchor_t, box=box, obj=obj,
                             cls=cls, label_smoothing=label_smoothing, image_size=image_size,
                             batch_scaled=batch_scaled)

    def _scaled_gains(self) -> tuple[float, float, float]:
        """(box, obj, cls) gains as used: YOLOv5's scaling for image_size, classes and one level, if set."""
        if self.image_size is None:
            return self.box, self.obj, self.cls
        return (self.box * _LEVEL_FACTOR,
                self.obj * (self.image_size / REFERENCE_IMAGE_SIZE) ** 2 * _LEVEL_FACTOR,
                self.cls * self.num_classes / REFERENCE_CLASSES * _LEVEL_FACTOR)

    # ------------------------------------------------------------------ forward
    def forward(self, pred: Any, target: Any) -> float:
        xp = array_namespace(pred)
        batch, anchors, per_anchor, height, width = self._check_output(pred)
        targets = self._targets(target)
        if targets.ndim != 3 or targets.shape[2] != 5:
            raise ShapeError(f"DetectionLoss got targets of shape {tuple(targets.shape)}; expected (batch, "
                             "max_objects, 5) rows (class, x1, y1, x2, y2) in pixels, class -1 for padding")
        if targets.shape[0] != batch:
            raise ShapeError(f"DetectionLoss got an output for {batch} images and targets for {targets.shape[0]}; "
                             "expected one (max_objects, 5) block of targets per image")
        try:
            check_targets(targets, count=batch, size=(height * self.stride, width * self.stride),
                          num_classes=self.num_classes)
        except ValueError as exc:  # the Trainer's batches are shuffled: say which numbering the message uses
            raise ValueError(
                f"DetectionLoss: {exc} (the image number is its position in this batch, not its index in the data "
                f"set; DetectionDataset(images, targets, num_classes={self.num_classes}) checks every image up "
                "front and names its data set index)"
            ) from exc
        box_gain, obj_gain, cls_gain = self.gains
        factor = float(batch) if self.batch_scaled else 1.0
        slots = batch * anchors * height * width
        self._obj_factor = obj_gain * factor / slots
        objectness = self._objectness(pred.reshape(batch, anchors, per_anchor, height, width)[:, :, 4], xp)
        assignment = assign_targets(targets, self.anchors, self.stride, height, width, self.anchor_t)
        l_box = l_cls = 0.0
        self._index = self._slot_grad = None
        if assignment.count:
            l_box, l_cls, positive = self._positives(pred, assignment, factor, xp)
            objectness -= positive
        l_obj = objectness / slots
        self.components = {"box": l_box, "obj": l_obj, "cls": l_cls}
        return factor * (box_gain * l_box + obj_gain * l_obj + cls_gain * l_cls)

    def _positives(self, pred: Any, assignment: Assignment, factor: float, xp: Any) -> tuple[float, float, float]:
        """``(l_box, l_cls, Σ t·x)`` over the slots the entries fall on (x their objectness logit, t its target);
        keeps those slots' gradient for backward."""
        height, width = int(pred.shape[2]), int(pred.shape[3])
        per_anchor = 5 + self.num_classes
        box_gain, _, cls_gain = self.gains
        cells, inverse, last = assignment.cells(len(self.anchors), height, width)
        # slot (b, a, y, x) -> the offsets of its 5+C channels in the flat output: one integer-array index,
        # which every backend's namespace gathers and scatters
        plane, pixel = np.divmod(cells, height * width)
        index = (plane[:, None] * per_anchor + np.arange(per_anchor)) * (height * width) + pixel[:, None]
        self._index = self._device(index, xp)
        picked = self._host(pred.reshape(-1)[self._index]).astype(np.float64)
        entries = picked[inverse]
        grad = np.zeros_like(entries)
        n = assignment.count

        box_sigmoid = _sigmoid(entries[:, :4])
        decoded = np.concatenate([2.0 * box_sigmoid[:, :2] - 0.5,
                                  (2.0 * box_sigmoid[:, 2:]) ** 2 * assignment.anchor_wh], axis=1)
        overlap, d_overlap = ciou_with_grad(decoded, assignment.box)
        slope = box_sigmoid * (1.0 - box_sigmoid)
        d_decoded = np.concatenate([2.0 * slope[:, :2], 8.0 * box_sigmoid[:, 2:] * slope[:, 2:] * assignment.anchor_wh],
                                   axis=1)
        grad[:, :4] = (-box_gain * factor / n) * d_overlap * d_decoded

        l_cls = 0.0
        if self.num_classes > 1:
            logits = entries[:, 5:]
            wanted = np.full(logits.shape, self.label_smoothing / 2)
            wanted[np.arange(n), assignment.label] = 1.0 - self.label_smoothing / 2
            l_cls = float(np.mean(_softplus(logits) - wanted * logits))
            grad[:, 5:] = (cls_gain * factor / logits.size) * (_sigmoid(logits) - wanted)

        # entries sharing a slot add up: one weighted bincount over (slot, channel) pairs
        pairs = (inverse[:, None] * per_anchor + np.arange(per_anchor)).reshape(-1)
        slot_grad = np.bincount(pairs, weights=grad.reshape(-1), minlength=picked.size).reshape(picked.shape)
        obj_target = np.maximum(overlap[last], 0.0)
        slot_grad[:, 4] = -self._obj_factor * obj_target
        self._slot_grad = slot_grad
        return float(np.mean(1.0 - overlap)), l_cls, float(obj_target @ picked[:, 4])

    def _objectness(self, logits: Any, xp: Any) -> float:
        """Σ softplus(x) over the (B, A, H, W) objectness logits (the BCE with target 0); keeps σ(x) for backward."""
        work = self.buffer("softplus", tuple(logits.shape), logits.dtype, xp)
        xp.maximum(logits, 0, out=work)
        total = float(work.sum())
        xp.abs(logits, out=work)
        xp.negative(work, out=work)
        xp.exp(work, out=work)
        work += 1.0  # log(1 + e) rather than log1p (not in every namespace): off by < 1 ulp of 1 for a tiny e
        xp.log(work, out=work)
        total += float(work.sum())
        sigmoid = self.buffer("sigmoid", tuple(logits.shape), logits.dtype, xp)
        xp.multiply(logits, 0.5, out=sigmoid)  # σ(x) = (tanh(x/2) + 1) / 2: no overflow for any x
        xp.tanh(sigmoid, out=sigmoid)
        sigmoid += 1.0
        sigmoid *= 0.5
        self._sigmoid = sigmoid
        return total

    def _check_output(self, pred: Any) -> tuple[int, int, int, int, int]:
        anchors, per_anchor = len(self.anchors), 5 + self.num_classes
        shape = tuple(int(s) for s in getattr(pred, "shape", ()))
        if len(shape) != 4 or shape[1] != anchors * per_anchor:
            raise ShapeError(f"DetectionLoss got an output of shape {shape}; expected (batch, {anchors * per_anchor}, "
                             f"H, W): {anchors} anchors × (5 + {self.num_classes} classes) channels")
        return shape[0], anchors, per_anchor, shape[2], shape[3]

    def _targets(self, target: Any) -> np.ndarray:
        """Host targets (B, M, 5); a list of per-image (k, 5) arrays (what ``digit_canvases`` returns) is padded
        as a DataLoader's collate pads it."""
        if not isinstance(target, list | tuple):
            return self._host(target)
        images = check_targets(target)
        return pad_targets(images, max([1, *(len(rows) for rows in images)]))

    def _host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        return np.asarray(array) if self.backend is None else self.backend.to_host(array)

    def _device(self, array: np.ndarray, xp: Any) -> Any:
        return xp.asarray(array) if self.backend is None else self.backend.from_host(array)

    # ------------------------------------------------------------------ backward
    def backward(self, scale: float = 1.0) -> Any:
        sigmoid = self._sigmoid
        if sigmoid is None:
            raise RuntimeError("DetectionLoss.backward called before forward (or twice for one forward)")
        xp = array_namespace(sigmoid)
        batch, anchors, height, width = sigmoid.shape
        per_anchor = 5 + self.num_classes
        grad = self.buffer("grad", (batch, anchors * per_anchor, height, width), sigmoid.dtype, xp)
        grad[...] = 0
        view = grad.reshape(batch, anchors, per_anchor, height, width)
        xp.multiply(sigmoid, self._obj_factor * scale, out=view[:, :, 4])
        if self._slot_grad is not None:
            flat, index = grad.reshape(-1), self._index
            flat[index] = flat[index] + self._device((self._slot_grad * scale).astype(grad.dtype), xp)
        self._sigmoid = None
        return grad

    # ------------------------------------------------------------------ what the Trainer asks besides
    def predictions(self, output: Any) -> Any:
        """The decoded boxes (B, A·H·W, 5+C): x1, y1, x2, y2 in pixels, objectness, class probabilities."""
        return decode(output, self.anchors, self.stride, self.num_classes)

    def evaluator(self) -> DetectionEvaluator:
        """A fresh DetectionEvaluator (mAP@0.5 over what it is given) for this detector's anchors and classes."""
        return DetectionEvaluator(self.anchors, self.stride, self.num_classes)

    def example_target(self, output: Any, xp: Any) -> Any:
        """Targets without boxes for ``output``'s batch (one padding row an image), for ``nf.memory.profile``:
        the loss's buffers are the same whatever the boxes (the assignment's arrays are small host arrays)."""
        target = xp.zeros((int(output.shape[0]), 1, 5), dtype=output.dtype)
        target[..., 0] = -1
        return target

    def get_config(self) -> dict[str, Any]:
        return {"anchors": self.anchors.tolist(), "stride": self.stride, "num_classes": self.num_classes,
                "anchor_t": self.anchor_t, "box": self.box, "obj": self.obj, "cls": self.cls,
                "label_smoothing": self.label_smoothing, "image_size": self.image_size,
                "batch_scaled": self.batch_scaled}

    def __repr__(self) -> str:
        return (f"DetectionLoss(anchors={self.anchors.tolist()}, stride={self.stride}, "
                f"num_classes={self.num_classes}, gains={tuple(round(g, 6) for g in self.gains)})")


def _check_anchors(anchors: Any) -> np.ndarray:
    try:
        array = np.asarray(anchors, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"DetectionLoss: anchors must be (w, h) pairs in pixels; got {anchors!r}") from None
    if array.ndim != 2 or array.shape[1] != 2 or len(array) == 0:
        raise ConfigError(f"DetectionLoss: anchors has shape {array.shape}; expected (A, 2) (w, h) pairs in pixels")
    if not (np.isfinite(array).all() and (array > 0).all()):
        raise ConfigError(f"DetectionLoss: anchor sizes must be positive and finite; got {array.tolist()}")
    return array


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"DetectionLoss: {name} must be a positive integer; got {value!r}")
    return int(value)
