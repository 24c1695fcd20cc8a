"""Target assignment for one detection level, YOLOv5's rule: which (image, anchor, cell) predicts which box.

A ground-truth box, in grid units (pixels / stride), goes to every anchor
whose width and height ratios r (box / anchor) all have ``max(r, 1/r) <
anchor_t``, and for each such anchor to the cell holding its centre plus
the neighbouring cells whose edge lies within half a cell of the centre: the
left cell when the centre's x fraction is below 0.5, the right one when it is
above 0.5, and likewise up and down, so two neighbours for most centres.
As in YOLOv5, a neighbour is taken only when the centre lies more than one
cell from the grid's edge on that side (``x > 1`` for the left one,
``W - x > 1`` for the right one), which keeps every cell inside the grid,
and a neighbour is the cell holding the point half a cell from the centre:
for a centre exactly on a cell edge (x fraction 0) YOLOv5's test takes both
sides, the left cell and, as "right", the centre's own cell a second time.
That duplicate is kept, so this assignment is YOLOv5's entry for entry.

Entries come in YOLOv5's order: by offset (own cell, left, up, right, down),
then by anchor, then by box (the batch's boxes image by image, each image's
in its row order). When several entries fall on one (image, anchor, cell),
the box and class losses count each of them, and the objectness target is
the last one's (:meth:`Assignment.cells`), as YOLOv5's ``tobj[...] = iou``
leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Half a cell: YOLOv5's ``g``, how near a neighbouring cell's edge the centre must be.
NEIGHBOUR_REACH = 0.5
# (own, left, up, right, down): the cell index is floor(centre - offset)
_OFFSETS = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) * NEIGHBOUR_REACH


@dataclass(frozen=True)
class Assignment:
    """The n entries of a batch's assignment, one per (box, anchor, cell) pair, host arrays.

    ``image``, ``anchor``, ``row`` (gy), ``col`` (gx), ``label``: (n,) intp.
    ``box``: (n, 4) float64 target (x, y, w, h) in grid units with (x, y) the
    centre relative to the cell's top-left corner (within (-0.5, 1.5)).
    ``anchor_wh``: (n, 2) float64 anchor (w, h) in grid units.
    """

    image: np.ndarray
    anchor: np.ndarray
    row: np.ndarray
    col: np.ndarray
    label: np.ndarray
    box: np.ndarray
    anchor_wh: np.ndarray

    @property
    def count(self) -> int:
        """The number of entries n."""
        return int(self.image.shape[0])

    def cells(self, anchors: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct (image, anchor, cell) slots the entries fall on, as flat indices into (B, A, H, W).

        Returns ``(slots, inverse, last)``: ``slots`` (u,) sorted, ``inverse``
        (n,) the slot of each entry, ``last`` (u,) the entry that sets the slot's
        objectness target (the last entry on it).
        """
        flat = ((self.image * anchors + self.anchor) * height + self.row) * width + self.col
        reversed_slots, first_reversed = np.unique(flat[::-1], return_index=True)
        last = self.count - 1 - first_reversed
        return reversed_slots, np.searchsorted(reversed_slots, flat), last


def assign_targets(targets: np.ndarray, anchors: np.ndarray, stride: float, height: int, width: int,
                   anchor_t: float = 4.0) -> Assignment:
    """Assign the boxes of a padded (B, M, 5) batch (rows class, x1, y1, x2, y2 in pixels; class -1 pads)
    to anchors (A, 2) (w, h pixels) and cells of an ``height`` × ``width`` grid of ``stride`` pixels.

    The targets are taken as valid (see ``targets.check_targets``).
    """
    rows = np.asarray(targets, dtype=np.float64)
    image, _ = np.nonzero(rows[:, :, 0] != -1)
    boxes = rows[rows[:, :, 0] != -1]
    centre = (boxes[:, 1:3] + boxes[:, 3:5]) / (2.0 * stride)
    size = (boxes[:, 3:5] - boxes[:, 1:3]) / stride
    grid_anchors = np.asarray(anchors, dtype=np.float64) / stride

    ratio = size[None, :, :] / grid_anchors[:, None, :]  # (A, boxes, 2)
    anchor, box = np.nonzero(np.maximum(ratio, 1.0 / ratio).max(axis=2) < anchor_t)
    xy = centre[box]
    back = np.array([width, height], dtype=np.float64) - xy
    near_low = (xy % 1.0 < NEIGHBOUR_REACH) & (xy > 1.0)  # left (x), up (y)
    near_high = (back % 1.0 < NEIGHBOUR_REACH) & (back > 1.0)  # right (x), down (y)
    taken = np.stack([np.ones(len(xy), bool), near_low[:, 0], near_low[:, 1], near_high[:, 0], near_high[:, 1]])
    offset, entry = np.nonzero(taken)

    xy = xy[entry]
    cell = np.floor(xy - _OFFSETS[offset])
    cell[:, 0] = np.clip(cell[:, 0], 0, width - 1)
    cell[:, 1] = np.clip(cell[:, 1], 0, height - 1)
    owner, anchor = box[entry], anchor[entry]
    return Assignment(
        image=image[owner].astype(np.intp),
        anchor=anchor.astype(np.intp),
        row=cell[:, 1].astype(np.intp),
        col=cell[:, 0].astype(np.intp),
        label=boxes[owner, 0].astype(np.intp),
        box=np.concatenate([xy - cell, size[owner]], axis=1),
        anchor_wh=grid_anchors[anchor],
    )
