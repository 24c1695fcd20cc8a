"""StreamAugmenter: seeded random affine geometry and colour jitter, applied per batch in one pass.

Each sample's geometry (rotation, scale, translation, flips) is composed as a
3×3 matrix on the host, in float64; the batch is then resampled once,
bilinearly, on the array namespace of the batch (numpy on the cpu backend,
the device's namespace on others): four gathers and a weighted sum, whatever
the number of transforms composed. Colour jitter (brightness, contrast) is a
per-sample affine map of the values applied after resampling.

Given detection targets too (``aug(x, boxes)``, boxes a padded ``(N, M, 5)``
batch of ``(class, x1, y1, x2, y2)`` rows in pixels), the same geometry
moves the boxes: each becomes the box enclosing its four transformed
corners, clipped to the image; one left too small is dropped (a padding
row, class -1), and the kept rows of an image come first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow import random
from neuroflow.errors import ShapeError
from neuroflow_ops_vision.layout import check_layout, expected_text


def _namespace(array: Any) -> Any:
    if isinstance(array, np.ndarray):
        return np
    space = getattr(array, "__array_namespace__", None)
    return space() if space is not None else np


def _translation(tx: Any, ty: Any) -> np.ndarray:
    m = np.zeros((len(tx), 3, 3))
    m[:, 0, 0] = m[:, 1, 1] = m[:, 2, 2] = 1.0
    m[:, 0, 2], m[:, 1, 2] = tx, ty
    return m


class StreamAugmenter:
    """Random affine + colour augmentation of image batches: ``aug(x_batch) -> x_aug``.

    ``rotation``: maximum angle in degrees (uniform in ±rotation);
    ``scale``: (low, high) zoom factor; ``translate``: maximum shift as a
    fraction of (width, height); ``hflip``/``vflip``: probability of a flip;
    ``brightness``/``contrast``: factors drawn from [1 − v, 1 + v];
    ``fill``: the value of pixels that come from outside the image;
    ``clip``: optional (low, high) range of the output values. Batches are
    (N, C, H, W), or (N, H, W, C) with ``layout="NHWC"``; the output has the
    batch's shape and dtype. The same ``seed`` gives the same sequence of
    augmented batches; ``seed=None`` draws one from ``nf.manual_seed``.

    ``aug(x, targets) -> (x_aug, targets_aug)`` moves detection boxes, a
    padded ``(N, M, 5)`` batch, with the pixels; a box whose clipped width or
    height is under ``min_box_size`` pixels, or that keeps less than
    ``min_box_visible`` of its transformed area inside the image, is dropped.
    Other targets (a label or vector per sample) are returned unchanged. The
    Trainer passes a batch's targets to an augmenter whose
    ``transforms_targets`` attribute is true, as this one's is.

    Example::

        aug = StreamAugmenter(rotation=10, scale=(0.9, 1.1), translate=(0.1, 0.1), seed=0)
        x_aug = aug(x_batch)
        x_aug, boxes_aug = aug(x_batch, boxes)
    """

    #: The Trainer calls ``aug(x, targets)`` (not ``aug(x)``) on an augmenter that declares this.
    transforms_targets = True

    def __init__(self, rotation: float = 0.0, scale: tuple[float, float] = (1.0, 1.0),
                 translate: tuple[float, float] = (0.0, 0.0), hflip: float = 0.0, vflip: float = 0.0,
                 brightness: float = 0.0, contrast: float = 0.0, fill: float = 0.0,
                 clip: tuple[float, float] | None = None, layout: str = "NCHW", seed: int | None = None,
                 min_box_size: float = 2.0, min_box_visible: float = 0.25) -> None:
        self.rotation = float(rotation)
        self.scale = (float(scale[0]), float(scale[1]))
        self.translate = (float(translate[0]), float(translate[1]))
        self.hflip, self.vflip = float(hflip), float(vflip)
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.fill = float(fill)
        self.clip = None if clip is None else (float(clip[0]), float(clip[1]))
        self.layout = check_layout(layout, "StreamAugmenter")
        self.min_box_size, self.min_box_visible = float(min_box_size), float(min_box_visible)
        if not (self.min_box_size >= 0 and 0 <= self.min_box_visible <= 1):
            raise ValueError(f"StreamAugmenter: min_box_size must be ≥ 0 pixels and min_box_visible in [0, 1]; "
                             f"got {min_box_size} and {min_box_visible}")
        if not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"StreamAugmenter: scale must be (low, high) with 0 < low ≤ high; got {scale}")
        for name in ("hflip", "vflip"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"StreamAugmenter: {name} is a probability in [0, 1]; got {getattr(self, name)}")
        for name in ("rotation", "brightness", "contrast"):
            if getattr(self, name) < 0:
                raise ValueError(f"StreamAugmenter: {name} must be ≥ 0; got {getattr(self, name)}")
        self.seed = random.child_seed() if seed is None else int(seed)
        self.rng = np.random.default_rng(self.seed)
        self._grids: dict[tuple[int, int, int], Any] = {}

    @property
    def has_geometry(self) -> bool:
        return bool(self.rotation or self.scale != (1.0, 1.0) or any(self.translate) or self.hflip or self.vflip)

    def reset(self) -> None:
        """Restart the random sequence from ``seed``."""
        self.rng = np.random.default_rng(self.seed)

    # ------------------------------------------------------------------ host side
    def _draw(self, n: int) -> np.ndarray:
        """Eight uniform numbers per sample, always drawn, so enabling one option does not shift the others.

        Columns: angle, zoom, x shift, h-flip, v-flip, y shift, brightness, contrast.
        """
        return self.rng.random((n, 8))

    def matrices(self, u: np.ndarray, height: int, width: int) -> np.ndarray:
        """(N, 3, 3) forward maps in pixel coordinates (x = column, y = row) for the draws ``u``."""
        n = len(u)
        angle = np.deg2rad((2 * u[:, 0] - 1) * self.rotation)
        zoom = self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 1]
        fx = np.where(u[:, 3] < self.hflip, -1.0, 1.0)
        fy = np.where(u[:, 4] < self.vflip, -1.0, 1.0)
        cos, sin = np.cos(angle) * zoom, np.sin(angle) * zoom
        linear = np.zeros((n, 3, 3))
        linear[:, 0, 0], linear[:, 0, 1] = cos * fx, -sin * fy
        linear[:, 1, 0], linear[:, 1, 1] = sin * fx, cos * fy
        linear[:, 2, 2] = 1.0
        cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
        shift_x = (2 * u[:, 2] - 1) * self.translate[0] * width
        shift_y = (2 * u[:, 5] - 1) * self.translate[1] * height
        centre = _translation(np.full(n, -cx), np.full(n, -cy))
        back = _translation(cx + shift_x, cy + shift_y)
        return back @ linear @ centre

    # ------------------------------------------------------------------ device side
    def __call__(self, x: Any, targets: Any = None) -> Any:
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 4 or getattr(x, "dtype", np.dtype("O")).kind != "f":
            raise ShapeError(
                f"StreamAugmenter got a batch of shape {shape} and dtype {getattr(x, 'dtype', None)}; "
                f"expected a floating {expected_text(None, self.layout)} array"
            )
        n = shape[0]
        h, w = (shape[2], shape[3]) if self.layout == "NCHW" else (shape[1], shape[2])
        boxes = None if targets is None else self._box_targets(targets, n)
        u = self._draw(n)
        xp = _namespace(x)
        forward = self.matrices(u, h, w) if self.has_geometry else None
        y = xp.array(x, copy=True) if forward is None else self.resample(x, np.linalg.inv(forward))
        if self.brightness or self.contrast:
            self._jitter(xp, y, u[:, 6], u[:, 7])
        if self.clip is not None:
            xp.clip(y, self.clip[0], self.clip[1], out=y)
        if targets is None:
            return y
        if boxes is None:
            return y, targets
        return y, boxes.copy() if forward is None else self.transform_boxes(boxes, forward, h, w)

    @staticmethod
    def _box_targets(targets: Any, n: int) -> np.ndarray | None:
        """``targets`` as a host (N, M, 5) box batch; None for per-sample targets, which geometry leaves alone."""
        shape = tuple(getattr(targets, "shape", np.shape(targets)))
        if not shape or shape[0] != n:
            raise ShapeError(f"StreamAugmenter got {n} images and targets of shape {shape}; expected one target "
                             "(row of boxes) per image")
        if len(shape) <= 2:
            return None
        if len(shape) != 3 or shape[2] != 5:
            raise ShapeError(f"StreamAugmenter: box targets must have shape (N, M, 5) (class, x1, y1, x2, y2); "
                             f"got {shape}")
        return np.asarray(targets)

    def transform_boxes(self, boxes: np.ndarray, forward: np.ndarray, height: int, width: int) -> np.ndarray:
        """The (N, M, 5) boxes moved by the forward maps ``forward`` (N, 3, 3): enclosing boxes of the corners,
        clipped to the image, the too-small ones dropped (class -1) after the kept ones."""
        real = boxes[:, :, 0] != -1
        # corners in the matrices' coordinates, where pixel (i, j) has its centre at (j, i)
        xs = boxes[:, :, [1, 3, 3, 1]].astype(np.float64) - 0.5
        ys = boxes[:, :, [2, 2, 4, 4]].astype(np.float64) - 0.5
        m = forward[:, None, None, :, :]
        tx = m[..., 0, 0] * xs + m[..., 0, 1] * ys + m[..., 0, 2] + 0.5
        ty = m[..., 1, 0] * xs + m[..., 1, 1] * ys + m[..., 1, 2] + 0.5
        x1, x2, y1, y2 = tx.min(axis=2), tx.max(axis=2), ty.min(axis=2), ty.max(axis=2)
        full = (x2 - x1) * (y2 - y1)
        x1, x2 = np.clip(x1, 0, width), np.clip(x2, 0, width)
        y1, y2 = np.clip(y1, 0, height), np.clip(y2, 0, height)
        bw, bh = x2 - x1, y2 - y1
        keep = real & (bw > 0) & (bh > 0) & (bw >= self.min_box_size) & (bh >= self.min_box_size)
        keep &= bw * bh >= self.min_box_visible * full
        moved = np.stack([boxes[:, :, 0], x1, y1, x2, y2], axis=2).astype(boxes.dtype)
        moved[~keep] = 0
        moved[:, :, 0][~keep] = -1
        order = np.argsort(~keep, axis=1, kind="stable")  # kept rows first, in their order
        return np.take_along_axis(moved, order[:, :, None], axis=1)

    def _grid(self, xp: Any, h: int, w: int) -> Any:
        key = (id(xp), h, w)
        if key not in self._grids:
            rows, cols = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
            self._grids[key] = xp.asarray(np.stack([cols.ravel(), rows.ravel(), np.ones(h * w)]))
        return self._grids[key]

    def resample(self, x: Any, inverse: np.ndarray) -> Any:
        """Bilinear resampling: output pixel p takes the input at ``inverse[n] @ p`` (``fill`` outside)."""
        xp = _namespace(x)
        nchw = self.layout == "NCHW"
        n, c, h, w = x.shape if nchw else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
        src = xp.matmul(xp.asarray(inverse[:, :2, :]), self._grid(xp, h, w))  # (N, 2, H·W)
        sx, sy = src[:, 0], src[:, 1]
        x0, y0 = xp.floor(sx), xp.floor(sy)
        ax, ay = sx - x0, sy - y0
        flat = x.reshape(n, c, h * w) if nchw else x.reshape(n, h * w, c)
        out = xp.zeros(flat.shape, dtype=x.dtype)
        outside = xp.zeros((n, h * w), dtype=x.dtype)
        for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            cx, cy = x0 + dx, y0 + dy
            weight = (ax if dx else 1.0 - ax) * (ay if dy else 1.0 - ay)
            valid = (cx >= 0) & (cx <= w - 1) & (cy >= 0) & (cy <= h - 1)
            index = (xp.clip(cy, 0, h - 1) * w + xp.clip(cx, 0, w - 1)).astype(np.int64)
            inside = (weight * valid).astype(x.dtype)
            outside += (weight * ~valid).astype(x.dtype)
            if nchw:
                out += xp.take_along_axis(flat, index[:, None, :], axis=2) * inside[:, None, :]
            else:
                out += xp.take_along_axis(flat, index[:, :, None], axis=1) * inside[:, :, None]
        if self.fill:
            out += (outside * self.fill)[:, None, :] if nchw else (outside * self.fill)[:, :, None]
        return out.reshape(x.shape)

    def _jitter(self, xp: Any, y: Any, u_brightness: np.ndarray, u_contrast: np.ndarray) -> None:
        """y ← b·(c·y + (1 − c)·mean(y)) per sample, in place (torchvision's order: contrast, then brightness)."""
        n = y.shape[0]
        factor_b = 1.0 + self.brightness * (2 * u_brightness - 1)
        factor_c = 1.0 + self.contrast * (2 * u_contrast - 1)
        mean = y.reshape(n, -1).mean(axis=1)
        scale = xp.asarray((factor_b * factor_c).astype(y.dtype))
        offset = xp.asarray(factor_b * (1.0 - factor_c)).astype(y.dtype) * mean
        view = (slice(None),) + (None,) * 3
        y *= scale[view]
        y += offset[view]

    def __repr__(self) -> str:
        parts = [f"rotation={self.rotation:g}"] if self.rotation else []
        if self.scale != (1.0, 1.0):
            parts.append(f"scale={self.scale}")
        if any(self.translate):
            parts.append(f"translate={self.translate}")
        parts += [f"{k}={getattr(self, k):g}" for k in ("hflip", "vflip", "brightness", "contrast") if getattr(self, k)]
        return f"StreamAugmenter({', '.join(parts + [f'seed={self.seed}'])})"

