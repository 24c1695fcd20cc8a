"""PyTorch twins of NeuroFlow-YOLO-lite and of YOLOv5's loss for one level, for side-by-side checks (tests,
``benchmarks/detector.py``) and as the reference of ``DetectionLoss``. PyTorch is imported only when one is
built or called and is never a dependency of this package.

The model has :func:`~neuroflow_ops_vision.detection.model.yolo_lite`'s parameter and buffer names in its order
(``stage1.0.weight``, ..., ``neck.1.0.0.depthwise.weight``, ``head.2.bias``), so its state dict loads by name
(``strict=False``: NeuroFlow keeps no ``num_batches_tracked``).

The loss is YOLOv5's ``ComputeLoss`` (v7.0, ``utils/loss.py``) for one output level, on the detection contract's
tensors: the raw head (B, A·(5+C), H, W) and padded targets (B, M, 5) of (class, x1, y1, x2, y2) in pixels,
class −1 for padding. Each box goes to every anchor whose width and height ratios to the box are both within
``anchor_t`` (max(r, 1/r) < anchor_t), in its own cell and in the neighbouring cells its centre is within half a
cell of (left/up and right/down; none at the outer border). Box loss: mean over assignments of 1 − CIoU
(YOLOv5's ``bbox_iou(xywh=True, CIoU=True)``, eps 1e-7, the aspect weight α held constant);
objectness: BCE with logits, mean over every (b, a, y, x), against the detached CIoU clamped at 0 at assigned
slots (where two assignments share a slot the later one counts, in YOLOv5's order: offset group, then anchor,
then box) and 0 elsewhere; classes: BCE with logits against one-hot targets, mean over assignments × C (skipped
for one class). Total: ``box·lbox + obj·lobj + cls·lcls``, not multiplied by the batch size (YOLOv5 multiplies).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from neuroflow_ops_vision.detection.model import DEFAULT_ANCHORS, NUM_ANCHORS, STRIDE, channel_widths, check_anchors

#: The neighbouring-cell offsets of YOLOv5's assignment (in half cells): own cell, then x−, y−, x+, y+ neighbours.
OFFSETS = ((0, 0), (1, 0), (0, 1), (-1, 0), (0, -1))


def torch_yolo_lite(num_classes: int = 10, anchors: Any = None, image_size: int = 96, in_channels: int = 1,
                    width: float = 1.0) -> Any:
    """:func:`~neuroflow_ops_vision.detection.model.yolo_lite` in PyTorch: the same layers, names and output."""
    import torch  # lazy: optional, the reference of tests and benchmarks only
    from torch import nn

    class BatchNormReLU(nn.BatchNorm2d):
        """BatchNorm2d then ReLU under BatchNorm's names (NeuroFlow fuses the ReLU into its BatchNorm2d)."""

        def forward(self, x: Any) -> Any:
            return torch.relu(super().forward(x))

    class SeparableConv2d(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.depthwise = nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False)
            self.pointwise = nn.Conv2d(cin, cout, 1, bias=False)

        def forward(self, x: Any) -> Any:
            return self.pointwise(self.depthwise(x))

    class SqueezeExcitation(nn.Module):  # torchvision's, without torchvision
        def __init__(self, channels: int, squeeze: int) -> None:
            super().__init__()
            self.fc1 = nn.Conv2d(channels, squeeze, 1)
            self.fc2 = nn.Conv2d(squeeze, channels, 1)

        def forward(self, x: Any) -> Any:
            gate = self.fc2(torch.relu(self.fc1(x.mean(dim=(2, 3), keepdim=True))))
            return x * torch.sigmoid(gate)

    class ChannelConcat(nn.Module):
        def __init__(self, *branches: nn.Module) -> None:
            super().__init__()
            for i, branch in enumerate(branches):
                self.add_module(str(i), branch)

        def forward(self, x: Any) -> Any:
            return torch.cat([branch(x) for branch in self.children()], dim=1)

    def conv_bn_relu(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [SeparableConv2d(cin, cout, stride), BatchNormReLU(cout)]

    def stage(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(*conv_bn_relu(cin, cout, 2), *conv_bn_relu(cout, cout, 1))

    class YoloLite(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchors = check_anchors(DEFAULT_ANCHORS if anchors is None else anchors)
            self.stride, self.num_classes = STRIDE, int(num_classes)
            c1, c2, c3, c4, head = channel_widths(width)
            self.stage1 = nn.Sequential(nn.Conv2d(in_channels, c1, 3, 2, 1, bias=False), BatchNormReLU(c1),
                                        *conv_bn_relu(c1, c1, 1))
            self.stage2, self.stage3 = stage(c1, c2), stage(c2, c3)
            self.neck = ChannelConcat(nn.Sequential(), nn.Sequential(
                stage(c3, c4), SqueezeExcitation(c4, max(1, c4 // 4)), nn.Upsample(scale_factor=2, mode="nearest")))
            self.head = nn.Sequential(*conv_bn_relu(c3 + c4, head, 1),
                                      nn.Conv2d(head, NUM_ANCHORS * (5 + self.num_classes), 1))

        def forward(self, x: Any) -> Any:
            return self.head(self.neck(self.stage3(self.stage2(self.stage1(x)))))

    del image_size  # the same layers for any canvas; NeuroFlow's head priors come with its copied weights
    return YoloLite()


def load_neuroflow_weights(twin: Any, state: dict[str, Any]) -> Any:
    """Copy a NeuroFlow model's state dict into ``twin`` by name (every name must match but
    ``num_batches_tracked``); returns ``twin``."""
    import torch  # lazy: optional

    result = twin.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=False)
    if result.unexpected_keys or any(not k.endswith("num_batches_tracked") for k in result.missing_keys):
        raise RuntimeError(f"state dicts differ: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    return twin


def torch_bbox_ciou(box1: Any, box2: Any, eps: float = 1e-7) -> Any:
    """YOLOv5's ``bbox_iou(box1, box2, xywh=True, CIoU=True)`` for paired (n, 4) boxes (cx, cy, w, h)."""
    import torch  # lazy: optional

    (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.chunk(4, -1), box2.chunk(4, -1)
    b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    inter = ((b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(0)
             * (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)
    ch = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return (iou - (rho2 / c2 + v * alpha)).squeeze(-1)


def torch_build_targets(targets: Any, anchors: Any, stride: int, grid: tuple[int, int],
                        anchor_t: float = 4.0) -> tuple[Any, ...]:
    """YOLOv5's ``build_targets`` for one level from padded (B, M, 5) pixel targets.

    Returns ``(image, anchor, gy, gx, box, cls)``: per assignment its indices, the box (x, y offsets from the
    cell's corner, w, h; grid units) and its class, in YOLOv5's order.
    """
    import torch  # lazy: optional

    t = torch.as_tensor(targets, dtype=torch.float64)
    image = torch.nonzero(t[..., 0] >= 0)[:, 0]
    rows = t[t[..., 0] >= 0]
    xy = (rows[:, 1:3] + rows[:, 3:5]) / 2 / stride
    wh = (rows[:, 3:5] - rows[:, 1:3]) / stride
    ny, nx = grid
    found = []
    anchor_grid = torch.as_tensor(np.asarray(anchors), dtype=torch.float64) / stride
    for a in range(len(anchor_grid)):  # anchor-major, as YOLOv5's repeat over anchors
        ratio = wh / anchor_grid[a]
        keep = torch.max(ratio, 1 / ratio).max(1).values < anchor_t
        found.append((torch.nonzero(keep)[:, 0], a))
    pieces = []
    inverse = torch.tensor([nx, ny], dtype=torch.float64) - xy
    near = {(1, 0): (xy[:, 0] % 1 < 0.5) & (xy[:, 0] > 1), (0, 1): (xy[:, 1] % 1 < 0.5) & (xy[:, 1] > 1),
            (-1, 0): (inverse[:, 0] % 1 < 0.5) & (inverse[:, 0] > 1), (0, -1): (inverse[:, 1] % 1 < 0.5) & (inverse[:, 1] > 1)}
    for offset in OFFSETS:
        for boxes, a in found:
            if offset != (0, 0):
                boxes = boxes[near[offset][boxes]]
            shift = torch.tensor(offset, dtype=torch.float64) * 0.5
            cell = (xy[boxes] - shift).long()
            cell[:, 0].clamp_(0, nx - 1)
            cell[:, 1].clamp_(0, ny - 1)
            box = torch.cat([xy[boxes] - cell, wh[boxes]], 1)
            pieces.append((image[boxes], torch.full_like(boxes, a), cell[:, 1], cell[:, 0], box, rows[boxes, 0].long()))
    return tuple(torch.cat([p[i] for p in pieces]) for i in range(6))


def torch_yolo_loss(output: Any, targets: Any, anchors: Any, stride: int, num_classes: int, anchor_t: float = 4.0,
                    box: float = 0.05, obj: float = 1.0, cls: float = 0.5) -> tuple[Any, Any]:
    """YOLOv5's loss for one level (module docstring): ``(total, tensor([lbox, lobj, lcls]))`` of the raw head
    ``output`` (B, A·(5+C), H, W), a torch tensor, against padded (B, M, 5) pixel ``targets``."""
    import torch  # lazy: optional
    import torch.nn.functional as F

    batch, _, ny, nx = output.shape
    head = output.view(batch, len(anchors), 5 + num_classes, ny, nx).permute(0, 1, 3, 4, 2)
    image, anchor, gy, gx, tbox, tcls = torch_build_targets(targets, anchors, stride, (ny, nx), anchor_t)
    anchor_grid = torch.as_tensor(np.asarray(anchors), dtype=output.dtype) / stride
    tobj = torch.zeros(head.shape[:4], dtype=output.dtype)
    lbox = lcls = torch.zeros((), dtype=output.dtype)
    if len(image):
        picked = head[image, anchor, gy, gx]
        pxy = picked[:, :2].sigmoid() * 2 - 0.5
        pwh = (picked[:, 2:4].sigmoid() * 2) ** 2 * anchor_grid[anchor]
        iou = torch_bbox_ciou(torch.cat((pxy, pwh), 1), tbox.to(output.dtype))
        lbox = (1.0 - iou).mean()
        tobj[image, anchor, gy, gx] = iou.detach().clamp(0).to(output.dtype)
        if num_classes > 1:
            onehot = torch.zeros_like(picked[:, 5:])
            onehot[torch.arange(len(image)), tcls] = 1.0
            lcls = F.binary_cross_entropy_with_logits(picked[:, 5:], onehot)
    lobj = F.binary_cross_entropy_with_logits(head[..., 4], tobj)
    total = box * lbox + obj * lobj + cls * lcls
    return total, torch.stack((lbox, lobj, lcls)).detach()
