"""Digit canvases: real MNIST digits (or Fashion-MNIST items) pasted onto noisy canvases, with their exact boxes.

Each object is one 28×28 image of the split, resized (antialiased bilinear)
to a random side in ``scales`` and pasted at a random place; its box is the
tight box of its ink after resizing (pixels at or above :data:`INK_LEVEL`,
the fainter fringe is dropped), so boxes are exact and the pixels outside
every box are background noise only. Objects may overlap a little but never
hide each other: at most ``max_overlap`` of either box is covered by another.
Canvas i is drawn from its own ``numpy.random.default_rng((seed, split, i))``:
the same arguments give the same canvases on every machine, and the first
canvases of a longer run are those of a shorter one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from neuroflow.data import ArrayDataset, fashion_mnist, mnist

#: The data sets the objects come from, by ``variant``; each has ten classes.
VARIANTS: dict[str, Callable[..., ArrayDataset]] = {"mnist": mnist, "fashion": fashion_mnist}
SPLITS = ("train", "test")
#: A resized object's pixels below this value are dropped: its box is the tight box of the rest.
INK_LEVEL = 0.1
NUM_CLASSES = 10
# Candidate places tried for one object before it is left out (the canvas is too crowded).
_PLACEMENT_TRIES = 32


def digit_canvases(split: str = "train", n: int = 1000, size: int = 96, max_objects: int = 5, seed: int = 0,
                   variant: str = "mnist", *, scales: tuple[int, int] = (16, 48), noise: float = 0.08,
                   max_overlap: float = 0.3, empty: float = 0.02) -> tuple[np.ndarray, list[np.ndarray]]:
    """``n`` canvases of ``split``'s digits and their ground truth: float32 ``(n, 1, size, size)`` in [0, 1], and
    one float32 ``(k, 5)`` array ``(class, x1, y1, x2, y2)`` per canvas.

    ``max_objects``: each canvas holds 1 to ``max_objects`` objects (fewer when
    no free place is found), or none with probability ``empty``; ``scales``:
    the (smallest, largest) side in pixels a 28×28 digit is resized to;
    ``noise``: the background is uniform in ``[0, noise)``; ``max_overlap``:
    the largest share of a box another box may cover; ``variant``: ``"mnist"``
    (digits) or ``"fashion"`` (Fashion-MNIST items). Training canvases use
    the training split's images, test canvases the test split's.

    >>> images, ground_truth = digit_canvases("test", 4, seed=1)
    >>> images.shape, ground_truth[0].shape[1]
    ((4, 1, 96, 96), 5)
    """
    check_canvas_options(split=split, n=n, size=size, max_objects=max_objects, seed=seed, variant=variant,
                         scales=scales, noise=noise, max_overlap=max_overlap, empty=empty)
    source = VARIANTS[variant](split, flat=False)
    digits, labels = source.x[:, 0], source.y
    if labels is None or not len(digits):
        raise ValueError(f"the {variant} {split} split holds no labelled images")
    images = np.empty((n, size, size), np.float32)
    ground_truth = []
    for i, canvas in enumerate(images):
        rng = np.random.default_rng((seed, SPLITS.index(split), i))  # canvas i is the same whatever n is
        rng.random(out=canvas, dtype=np.float32)
        canvas *= np.float32(noise)
        count = 0 if rng.random() < empty else int(rng.integers(1, max_objects + 1))
        ground_truth.append(_fill(canvas, count, digits, labels, rng, scales, max_overlap))
    return images[:, None], ground_truth


def check_canvas_options(*, split: str = "train", n: int = 0, size: int = 96, max_objects: int = 5, seed: int = 0,
                         variant: str = "mnist", scales: tuple[int, int] = (16, 48), noise: float = 0.08,
                         max_overlap: float = 0.3, empty: float = 0.02) -> None:
    """Raise ValueError naming the first option :func:`digit_canvases` refuses (reads no data)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS))}; got {split!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}; got {variant!r}")
    for name, value, low in (("n", n, 0), ("size", size, 1), ("max_objects", max_objects, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    pair = isinstance(scales, Sequence | np.ndarray) and not isinstance(scales, str) and len(scales) == 2
    smallest, largest = scales if pair else (None, None)
    if not (isinstance(smallest, int | np.integer) and isinstance(largest, int | np.integer)
            and 1 <= smallest <= largest <= size):
        raise ValueError(f"scales must be integer sides (smallest, largest) with 1 <= smallest <= largest <= "
                         f"size ({size}); got {scales!r}")
    for name, amount, upper in (("noise", noise, INK_LEVEL), ("max_overlap", max_overlap, 1.0), ("empty", empty, 1.0)):
        if not 0.0 <= amount <= upper:
            raise ValueError(f"{name} must be in [0, {upper:g}]; got {amount!r}")


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """The ``(n_out, n_in)`` matrix of a 1-D antialiased bilinear resample (a triangle filter widened by the
    shrink factor, as PIL's bilinear); an image ``a`` resizes to ``R_h @ a @ R_w.T``. Rows sum to 1."""
    return _resize_matrix(int(n_in), int(n_out)).copy()


@lru_cache(maxsize=256)
def _resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    ratio = n_in / n_out
    support = max(ratio, 1.0)
    centres = (np.arange(n_out) + 0.5) * ratio - 0.5
    weights = np.maximum(0.0, 1.0 - np.abs(np.arange(n_in)[None, :] - centres[:, None]) / support)
    weights /= weights.sum(axis=1, keepdims=True)
    weights.flags.writeable = False
    return weights


def _ink(digit: np.ndarray, side: int) -> tuple[np.ndarray, tuple[int, int, int, int]] | None:
    """The digit resized to side × side with its faint fringe dropped, and its ink's (top, left, bottom, right)
    (exclusive); None when no pixel reaches :data:`INK_LEVEL`."""
    r = _resize_matrix(digit.shape[0], side)
    patch = (r @ digit @ r.T).astype(np.float32)
    patch[patch < INK_LEVEL] = 0.0
    rows, cols = np.flatnonzero(patch.any(axis=1)), np.flatnonzero(patch.any(axis=0))
    if not rows.size:
        return None
    return patch, (int(rows[0]), int(cols[0]), int(rows[-1]) + 1, int(cols[-1]) + 1)


def _fill(canvas: np.ndarray, count: int, digits: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
          scales: tuple[int, int], max_overlap: float) -> np.ndarray:
    """Paste ``count`` objects onto ``canvas`` (in place) where they overlap little; their (k, 5) ground truth."""
    size = canvas.shape[0]
    rows: list[list[float]] = []
    for _ in range(count):
        side = int(rng.integers(scales[0], scales[1] + 1))
        index = int(rng.integers(len(digits)))
        top_left = rng.integers(0, size - side + 1, size=(_PLACEMENT_TRIES, 2))
        inked = _ink(digits[index], side)
        if inked is None:
            continue
        patch, (top, left, bottom, right) = inked
        # candidate boxes (x1, y1, x2, y2); the first that covers and is covered little by every placed one
        boxes = np.stack([top_left[:, 1] + left, top_left[:, 0] + top,
                          top_left[:, 1] + right, top_left[:, 0] + bottom], axis=1).astype(np.float64)
        free = _free(boxes, np.array([r[1:] for r in rows]).reshape(-1, 4), max_overlap)
        if not free.any():
            continue
        y, x = top_left[int(np.argmax(free))]
        region = canvas[y:y + side, x:x + side]
        np.maximum(region, patch, out=region)
        rows.append([float(labels[index]), x + left, y + top, x + right, y + bottom])
    return np.array(rows, np.float32).reshape(-1, 5)


def _free(candidates: np.ndarray, placed: np.ndarray, max_overlap: float) -> np.ndarray:
    """For each candidate box, whether no placed box covers more than ``max_overlap`` of it or of itself."""
    if not len(placed):
        return np.ones(len(candidates), bool)
    c, p = candidates[:, None, :], placed[None, :, :]
    w = np.clip(np.minimum(c[..., 2], p[..., 2]) - np.maximum(c[..., 0], p[..., 0]), 0, None)
    h = np.clip(np.minimum(c[..., 3], p[..., 3]) - np.maximum(c[..., 1], p[..., 1]), 0, None)
    area_c = (c[..., 2] - c[..., 0]) * (c[..., 3] - c[..., 1])
    area_p = (p[..., 2] - p[..., 0]) * (p[..., 3] - p[..., 1])
    covered = w * h / np.minimum(area_c, area_p)
    return (covered <= max_overlap).all(axis=1)
