"""Ground-truth boxes of a detection batch: checked, padded to a fixed (B, M, 5) and back.

One image's ground truth is a float32 ``(k, 5)`` array of rows
``(class, x1, y1, x2, y2)`` in pixels (x to the right, y down,
``0 <= x1 < x2 <= width``, ``0 <= y1 < y2 <= height``). A batch hands the
Trainer fixed shapes: ``(B, M, 5)`` with image b's rows first and padding
rows ``(-1, 0, 0, 0, 0)`` after them, M being the data set's ``max_objects``.
An image without objects is all padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from neuroflow.errors import ShapeError

#: The class of a padding row.
PAD_CLASS = -1.0
# Said of a row of zeros: most likely padding written with class 0.
_ZERO_ROW = ("; a row of zeros looks like padding, but padding rows must have class -1, (-1, 0, 0, 0, 0), "
             "as pad_targets writes them")


def check_targets(targets: Any, *, count: int | None = None, size: int | tuple[int, int] | None = None,
                  num_classes: int | None = None) -> list[np.ndarray]:
    """Each image's ``(k, 5)`` ground truth as float32, after checking it; raises ShapeError or ValueError.

    ``targets``: a sequence of ``(k, 5)`` arrays, one per image, or a padded
    ``(B, M, 5)`` batch. ``count``: the number of images they belong to;
    ``size``: the image's side (or ``(height, width)``) every box must lie in;
    ``num_classes``: class ids must be integers in ``[0, num_classes)``.
    Every error names the image and row at fault.
    """
    if isinstance(targets, np.ndarray) and targets.ndim == 3:
        images = unpad_targets(targets)
    elif isinstance(targets, Sequence | np.ndarray) and not isinstance(targets, str | bytes):
        images = [_as_rows(t, i) for i, t in enumerate(targets)]
    else:
        raise TypeError(f"detection targets must be a sequence of (k, 5) arrays or a (B, M, 5) array; "
                        f"got {type(targets).__name__}")
    if count is not None and len(images) != count:
        raise ValueError(f"got targets for {len(images)} images but {count} images; "
                         "give one (k, 5) array per image (an empty (0, 5) one for an image without objects)")
    height, width = (size, size) if isinstance(size, int | np.integer) else (size or (None, None))
    _check_rows(images, height, width, num_classes)
    return images


def pad_targets(targets: Any, max_objects: int) -> np.ndarray:
    """The ground truth of B images (a sequence of ``(k, 5)`` arrays) as one float32 ``(B, max_objects, 5)`` batch.

    >>> pad_targets([np.array([[3, 1, 2, 10, 12]]), np.zeros((0, 5))], 2)[:, :, 0]
    array([[ 3., -1.],
           [-1., -1.]], dtype=float32)
    """
    if isinstance(max_objects, bool) or not isinstance(max_objects, int | np.integer) or max_objects < 1:
        raise ValueError(f"max_objects must be a positive integer; got {max_objects!r}")
    images = check_targets(targets)
    padded = np.zeros((len(images), int(max_objects), 5), np.float32)
    padded[:, :, 0] = PAD_CLASS
    counts = np.array([len(rows) for rows in images], np.int64)
    if counts.size and counts.max() > max_objects:
        i = int(np.argmax(counts))
        raise ValueError(f"image {i} has {counts[i]} objects but max_objects is {max_objects}; "
                         "raise max_objects or drop objects")
    image, row = _owners(counts)
    padded[image, row] = np.concatenate(images) if images else np.zeros((0, 5), np.float32)
    return padded


def unpad_targets(padded: Any) -> list[np.ndarray]:
    """The ``(k, 5)`` ground truth of each image of a padded ``(B, M, 5)`` batch: its rows whose class is not -1."""
    batch = np.asarray(padded)
    if batch.ndim != 3 or batch.shape[2] != 5:
        raise ShapeError(f"padded detection targets must have shape (B, M, 5); got {batch.shape}")
    keep = batch[:, :, 0] != PAD_CLASS
    return [batch[i][keep[i]].astype(np.float32) for i in range(len(batch))]


def collate_detections(samples: Sequence[tuple[Any, Any]], max_objects: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch from ``(image, (k, 5) ground truth)`` pairs: stacked images and ``(B, max_objects, 5)`` targets."""
    if not samples:
        raise ValueError("collate_detections got no samples")
    images = np.stack([np.asarray(image) for image, _ in samples])
    return images, pad_targets([rows for _, rows in samples], max_objects)


def _as_rows(rows: Any, image: int) -> np.ndarray:
    array = np.asarray(rows, dtype=np.float32)
    if array.size == 0:
        return np.zeros((0, 5), np.float32)
    if array.ndim != 2 or array.shape[1] != 5:
        raise ShapeError(f"image {image}: ground truth must have shape (k, 5) (class, x1, y1, x2, y2); "
                         f"got {array.shape}")
    return array


def _owners(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every row of the images' rows concatenated: its image, and its position in that image."""
    image = np.repeat(np.arange(len(counts)), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return image, np.arange(len(image)) - starts[image]


def _check_rows(images: list[np.ndarray], height: int | None, width: int | None, num_classes: int | None) -> None:
    """Raise ValueError naming the image and row of the first bad class or box of all the images' rows."""
    rows = np.concatenate(images + [np.zeros((0, 5), np.float32)])
    image, row = _owners(np.array([len(r) for r in images], np.int64))

    def fail(bad: np.ndarray, problem: str) -> None:
        if bad.any():
            i = int(np.argmax(bad))
            padding = "" if rows[i].any() else _ZERO_ROW
            raise ValueError(f"image {image[i]}, row {row[i]}: " + problem.format(cls=f"{rows[i, 0]:g}",
                                                                                   box=_box(rows[i]), padding=padding))

    fail(~np.isfinite(rows).all(axis=1), "ground truth holds NaN or Inf")
    cls, x1, y1, x2, y2 = rows.T
    valid = f"integers in [0, {num_classes})" if num_classes else "non-negative integers"
    fail((cls != np.round(cls)) | (cls < 0) | (cls >= (num_classes or np.inf)),
         "class id {cls} is out of range; class ids are " + valid)
    fail((x2 <= x1) | (y2 <= y1), "box {box} has zero or negative area; expected x1 < x2 and y1 < y2{padding}")
    right, bottom = np.inf if width is None else width, np.inf if height is None else height
    image_text = "the image" if width is None else f"the {width}×{height} image"
    fail((x1 < 0) | (y1 < 0) | (x2 > right) | (y2 > bottom),
         "box {box} lies outside " + image_text + "; expected 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height")


def _box(row: np.ndarray) -> str:
    return "(" + ", ".join(f"{v:g}" for v in row[1:]) + ")"
