"""NeuroFlow-YOLO-lite: a one-level, three-anchor detector for small canvases, with YOLOv5's head initialisation.

Backbone: four stages of widths 32, 64, 128, 256 (× ``width``), each halving
the map: a 3×3 stride-2 convolution (dense in the first stage, which reads the
image's one or three channels; depthwise-separable after), BatchNorm and ReLU,
then a 3×3 stride-1 separable Conv-BN-ReLU. Squeeze-excite on the last stage.
Neck (FPN-lite): the last stage runs as a branch of a :class:`ChannelConcat`
on the third stage's stride-8 map, upsampled ×2 and stacked beside it. Head:
a separable Conv-BN-ReLU and a 1×1 convolution to ``A·(5 + C)`` channels.
The first convolution reads NCHW and writes NHWC, in which everything runs
until the last one writes the head NCHW again.

For the default 96-px canvas (stride 8): 230,349 parameters for 10 classes,
the head (B, 45, 12, 12). A head cell sees 59 px through the third stage and
over 100 px through the last: more than the largest (48-px) objects.

Output (``docs/tasks/detect-objects.md`` and the detection contract): the raw
head, channel ``a·(5+C) + j`` for anchor ``a``: ``j`` = 0 tx, 1 ty, 2 tw,
3 th, 4 objectness logit, 5… class logits; YOLOv5's decoding
(``cx = (2σ(tx) − 0.5 + gx)·stride``, ``w = (2σ(tw))²·anchor_w``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from neuroflow.composites import Sequential
from neuroflow.config.from_data import options_from_data
from neuroflow.errors import ShapeError
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow_ops_vision.attention import SqueezeExcite
from neuroflow_ops_vision.batchnorm import BatchNorm2d
from neuroflow_ops_vision.concat import ChannelConcat
from neuroflow_ops_vision.conv import Conv2d
from neuroflow_ops_vision.detection.model_options import yolo_lite_options
from neuroflow_ops_vision.separable import SeparableConv2d
from neuroflow_ops_vision.upsample import Upsample

#: Anchors (w, h) in pixels: ``kmeans_anchors`` (k=3, seed 0) of the ink boxes of 2,000 training digit canvases
#: (digits pasted at 16–48 px; their boxes 2–36 px wide, 7–36 high), rounded. Another data set: its own k-means.
DEFAULT_ANCHORS: tuple[tuple[float, float], ...] = ((11.0, 17.0), (18.0, 24.0), (27.0, 31.0))
NUM_ANCHORS = 3
STAGE_WIDTHS = (32, 64, 128, 256)
HEAD_WIDTH = 128
#: Pixels per head cell: the third stage's map.
STRIDE = 8
#: Pixels per cell of the last stage, upsampled onto the head's grid: H and W must be multiples of it.
DEEPEST_STRIDE = 16
#: The largest image side: a model file asking for more (``neuroflow predict`` letterboxes every image to it)
#: is refused when it is rebuilt.
MAX_IMAGE_SIZE = 4096
#: YOLOv5's objectness prior: about this many positive anchor slots per image, spread over the grid's cells.
OBJECTS_PER_IMAGE = 8.0


def check_anchors(anchors: Any) -> np.ndarray:
    """``anchors`` as a (3, 2) float32 array of positive finite pixel sizes (w, h); ValueError otherwise.

    Checked after the cast to float32, the dtype they are kept in: 1e308 is finite in float64 but inf in float32."""
    try:
        array = np.asarray(anchors, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"yolo_lite: anchors must be {NUM_ANCHORS} (w, h) pairs in pixels; got {anchors!r}") from None
    if array.shape != (NUM_ANCHORS, 2):
        raise ValueError(
            f"yolo_lite: anchors has shape {array.shape}; the head predicts {NUM_ANCHORS} anchors, so expected "
            f"({NUM_ANCHORS}, 2) (w, h) pairs in pixels, e.g. kmeans_anchors(boxes, k={NUM_ANCHORS})"
        )
    with np.errstate(over="ignore"):  # an overflow is refused below, by name
        kept = array.astype(np.float32)
    if not (np.isfinite(kept).all() and (kept > 0).all()):
        raise ValueError("yolo_lite: anchor sizes must be positive and finite in float32, which the model keeps "
                         f"them in (pixels, below 3.4e38); got {array.tolist()}")
    return kept


def channel_widths(width: float) -> tuple[int, int, int, int, int]:
    """The four stages' channel counts and the head's at the multiplier ``width`` (at least 4 each)."""
    c1, c2, c3, c4, head = (max(4, round(c * width)) for c in (*STAGE_WIDTHS, HEAD_WIDTH))
    return c1, c2, c3, c4, head


def _conv_bn_relu(cin: int, cout: int, stride: int, dtype: Any) -> list[Operator]:
    """3×3 depthwise-separable Conv-BN-ReLU in NHWC (the ReLU fused into the BatchNorm)."""
    return [SeparableConv2d(cin, cout, 3, stride=stride, padding=1, bias=False, layout="NHWC", dtype=dtype),
            BatchNorm2d(cout, activation="relu", layout="NHWC", dtype=dtype)]


def _stage(cin: int, cout: int, dtype: Any) -> Sequential:
    """A backbone stage: stride-2 separable Conv-BN-ReLU, then a stride-1 one."""
    return Sequential(*_conv_bn_relu(cin, cout, 2, dtype), *_conv_bn_relu(cout, cout, 1, dtype))


class YoloLite(Sequential):
    """NeuroFlow-YOLO-lite (see the module docstring): a Sequential of ``stage1``, ``stage2``, ``stage3``,
    ``neck`` and ``head``, built from its config, with ``anchors`` (3, 2), ``stride`` and ``num_classes``.

    Input (N, ``in_channels``, H, W) NCHW with H and W multiples of 16; output the raw head
    (N, 3·(5 + ``num_classes``), H/8, W/8), NCHW.
    """

    def __init__(self, num_classes: int = 10, anchors: Sequence[Sequence[float]] | None = None, image_size: int = 96,
                 in_channels: int = 1, width: float = 1.0, dtype: Any = np.float32) -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("image_size", image_size)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"yolo_lite: {name} must be a positive int; got {value!r}")
        if int(image_size) > MAX_IMAGE_SIZE:
            raise ValueError(f"yolo_lite: image_size={image_size} is above {MAX_IMAGE_SIZE}, the largest side it "
                             "takes (neuroflow predict letterboxes every image to image_size²); use a smaller size")
        if int(image_size) % DEEPEST_STRIDE:
            raise ValueError(
                f"yolo_lite: image_size={image_size} is not a multiple of {DEEPEST_STRIDE}: the last stage's map "
                f"(stride {DEEPEST_STRIDE}) is upsampled onto the head's stride-{STRIDE} grid; use e.g. "
                f"{max(DEEPEST_STRIDE, int(image_size) // DEEPEST_STRIDE * DEEPEST_STRIDE)}"
            )
        if isinstance(width, bool) or not isinstance(width, (int, float)) or not 0 < width <= 8 or not math.isfinite(width):
            raise ValueError(f"yolo_lite: width must be a multiplier in (0, 8]; got {width!r}")
        self.anchors = check_anchors(DEFAULT_ANCHORS if anchors is None else anchors)
        self.num_classes, self.image_size, self.in_channels = int(num_classes), int(image_size), int(in_channels)
        self.width, self.stride, self.num_anchors = float(width), STRIDE, NUM_ANCHORS
        c1, c2, c3, c4, head = channel_widths(self.width)
        stem = Conv2d(self.in_channels, c1, 3, stride=2, padding=1, bias=False, layout="NCHW", output_layout="NHWC",
                      dtype=dtype)
        self.outputs = NUM_ANCHORS * (5 + self.num_classes)
        predict = Conv2d(head, self.outputs, 1, layout="NHWC", output_layout="NCHW", dtype=dtype)
        # Named children (as ResNet's): the parameters read stage1.0.weight, ..., neck.1.0.0.depthwise.weight, head.2.bias.
        self.stage1 = Sequential(stem, BatchNorm2d(c1, activation="relu", layout="NHWC", dtype=dtype),
                                 *_conv_bn_relu(c1, c1, 1, dtype))
        self.stage2 = _stage(c1, c2, dtype)
        self.stage3 = _stage(c2, c3, dtype)
        deepest = Sequential(_stage(c3, c4, dtype), SqueezeExcite(c4, layout="NHWC", dtype=dtype),
                             Upsample(scale_factor=2, layout="NHWC"))
        self.neck = ChannelConcat(Sequential(), deepest, layout="NHWC")  # FPN-lite: stride 8 beside stride 16 ×2
        self.head = Sequential(*_conv_bn_relu(c3 + c4, head, 1, dtype), predict)
        self.layers = [self.stage1, self.stage2, self.stage3, self.neck, self.head]
        self._initialise_head(predict)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One sample's shape (C, H, W), e.g. (1, 96, 96): what ``neuroflow mem-profile`` plans a step for."""
        return (self.in_channels, self.image_size, self.image_size)

    def _initialise_head(self, predict: Conv2d) -> None:
        """YOLOv5's priors on the last biases (Lin et al., focal loss §4.1): each anchor slot starts at an
        objectness of about 8 objects per image over the grid's cells, each class at probability 0.6/(C − 0.99)."""
        cells = (self.image_size // self.stride) ** 2
        bias = predict.bias.data.reshape(NUM_ANCHORS, 5 + self.num_classes)
        bias[:, 4] += math.log(OBJECTS_PER_IMAGE / cells)
        bias[:, 5:] += math.log(0.6 / (self.num_classes - 0.99))

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        """ShapeError unless ``shape`` is (N, in_channels, H, W) with H and W multiples of 16."""
        name = f"YoloLite(classes={self.num_classes}, in_channels={self.in_channels})"
        if len(shape) != 4 or shape[1] != self.in_channels:
            raise ShapeError(f"{name} got input of shape {shape}; expected (N, {self.in_channels}, H, W) images, NCHW")
        if shape[2] % DEEPEST_STRIDE or shape[3] % DEEPEST_STRIDE:
            raise ShapeError(
                f"{name} got input of shape {shape}; H and W must be multiples of {DEEPEST_STRIDE} "
                f"(the head's grid is H/{STRIDE} × W/{STRIDE}, fused with the stride-{DEEPEST_STRIDE} map upsampled)"
            )

    def forward(self, x: Any) -> Any:
        self._check_shape(tuple(getattr(x, "shape", ())))  # the dtype: the first convolution checks it
        return super().forward(x)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        self._check_shape(tuple(input_shape))
        return super().memory_declaration(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "anchors": self.anchors.tolist(), "image_size": self.image_size,
                "in_channels": self.in_channels, "width": self.width}

    def __repr__(self) -> str:
        names = {id(child): name for name, child in self.named_children()}
        inner = "".join(f"\n  ({names[id(layer)]}): " + repr(layer).replace("\n", "\n  ") for layer in self.layers)
        anchors = ", ".join(f"{w:g}×{h:g}" for w, h in self.anchors)
        return f"YoloLite(classes={self.num_classes}, anchors=[{anchors}], stride={self.stride},{inner}\n)"


@options_from_data(yolo_lite_options)  # [model] anchors = "kmeans" in a config: fitted to the training boxes
def yolo_lite(num_classes: int = 10, anchors: Sequence[Sequence[float]] | None = None, image_size: int = 96,
              in_channels: int = 1, width: float = 1.0, dtype: Any = np.float32) -> YoloLite:
    """NeuroFlow-YOLO-lite for (N, ``in_channels``, ``image_size``, ``image_size``) canvases.

    ``anchors``: three (w, h) pairs in pixels (default :data:`DEFAULT_ANCHORS`; a data set's
    ``kmeans_anchors`` fit it better); ``width`` scales every channel count.

    Example::

        model = yolo_lite(num_classes=10)        # 230,349 parameters
        head = model.forward(x)                  # x: (N, 1, 96, 96) -> (N, 45, 12, 12)
        model.anchors, model.stride              # (3, 2) pixels, 8
    """
    return YoloLite(num_classes, anchors, image_size, in_channels, width, dtype)
