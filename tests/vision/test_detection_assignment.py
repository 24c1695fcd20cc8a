"""CIoU and YOLOv5's target assignment: against the corner formula, finite differences and a box-by-box rule,
at cell borders, at the grid's edge, on a cell edge and at the anchor ratio's limit."""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow_ops_vision.detection.assignment import assign_targets
from neuroflow_ops_vision.detection.ciou import ciou, ciou_with_grad

from .detection_loss_reference import ANCHORS, STRIDE, random_targets, reference_assignment, reference_ciou


# ---------------------------------------------------------------------- CIoU
def test_ciou_matches_the_corner_formula_and_its_gradient_holds_alpha_constant():
    rng = np.random.default_rng(3)
    pred = np.column_stack([rng.uniform(-0.5, 1.5, (300, 2)), rng.uniform(0.1, 4, (300, 2))])
    target = np.column_stack([rng.uniform(-0.5, 1.5, (300, 2)), rng.uniform(0.1, 4, (300, 2))])
    value, grad = ciou_with_grad(pred, target)
    expected, alpha = reference_ciou(pred, target)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(ciou(pred, target), value)
    for k in range(4):
        plus, minus = pred.copy(), pred.copy()
        plus[:, k] += 1e-6
        minus[:, k] -= 1e-6
        numeric = (reference_ciou(plus, target, alpha)[0] - reference_ciou(minus, target, alpha)[0]) / 2e-6
        np.testing.assert_allclose(grad[:, k], numeric, rtol=1e-6, atol=1e-8)


def test_ciou_of_identical_boxes_is_one_and_of_far_boxes_below_zero():
    box = np.array([[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_allclose(ciou(box, box), 1.0, atol=1e-6)
    far = np.array([[400.0, 2.0, 3.0, 4.0]])
    assert -1 < ciou(far, box)[0] < -0.98


# ---------------------------------------------------------------------- assignment
def _as_rows(assignment):
    return [(int(b), int(a), int(r), int(c), int(label), *box, *wh) for b, a, r, c, label, box, wh in zip(
        assignment.image, assignment.anchor, assignment.row, assignment.col, assignment.label, assignment.box,
        assignment.anchor_wh)]


def _assert_same_entries(targets, height, width):
    got = _as_rows(assign_targets(targets, ANCHORS, STRIDE, height, width))
    expected = reference_assignment(targets, ANCHORS, STRIDE, height, width)
    assert [g[:5] for g in got] == [e[:5] for e in expected]
    np.testing.assert_allclose(np.array(got, float).reshape(-1, 11), np.array(expected, float).reshape(-1, 11),
                               atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_assignment_matches_the_per_box_rule(seed):
    rng = np.random.default_rng(seed)
    _assert_same_entries(random_targets(rng, 3, 6, 4, 48, empty_images=(1,)), 6, 6)


def test_assignment_near_cell_borders_and_the_grid_edge():
    # centres at x = 0.3, 1.49, 1.5, 1.51, 3.02 and 3.98 cells of a 4-cell grid, and the corners of the image
    centres = [0.3, 1.49, 1.5, 1.51, 3.02, 3.98]
    rows = [[1, c * STRIDE - 4, c * STRIDE - 4, c * STRIDE + 4, c * STRIDE + 4] for c in centres]
    rows = [[0, max(r[1], 0), max(r[2], 0), min(r[3], 32), min(r[4], 32)] for r in rows]
    rows += [[2, 0, 0, 6, 6], [2, 26, 26, 32, 32]]
    targets = np.array([rows])
    _assert_same_entries(targets, 4, 4)
    result = assign_targets(targets, ANCHORS, STRIDE, 4, 4)
    assert result.col.min() >= 0 and result.col.max() <= 3 and result.row.min() >= 0 and result.row.max() <= 3
    own = result.box[:, :2]
    assert (own > -0.5).all() and (own < 1.5).all()
    # a centre at 1.49 cells also goes left and up, at 1.51 right and down, at exactly 1.5 to its cell alone
    at = {round(c, 2): set() for c in centres}
    for col, row, x in zip(result.col, result.row, result.box[:, 0] + result.col):
        if round(x, 2) in at:
            at[round(x, 2)].add((int(col), int(row)))
    assert at[1.49] == {(1, 1), (0, 1), (1, 0)}
    assert at[1.51] == {(1, 1), (2, 1), (1, 2)}
    assert at[1.5] == {(1, 1)}


def test_a_centre_on_a_cell_edge_takes_its_own_cell_twice_as_yolov5_does():
    # x = 2.0 cells: the left neighbour is cell 1; YOLOv5's right one, floor(2.0 + 0.5), is cell 2 itself
    targets = np.array([[[0, 12, 9, 20, 19]]])  # centre (2.0, 1.75) cells, 8 × 10 px: anchor 0 and 1
    result = assign_targets(targets, ANCHORS, STRIDE, 4, 4)
    cells = sorted(zip(result.anchor.tolist(), result.col.tolist(), result.row.tolist()))
    assert cells == sorted([(a, col, row) for a in (0, 1) for col, row in [(2, 1), (1, 1), (2, 1), (2, 2)]])
    slots, inverse, last = result.cells(len(ANCHORS), 4, 4)
    assert len(slots) == 6 and np.bincount(inverse).tolist().count(2) == 2


def test_assignment_takes_anchors_within_anchor_t_only():
    # a 3×3 px box is more than 4× smaller than every anchor's side but the first's height (13/3 > 4 as well)
    tiny = np.array([[[0, 10, 10, 13, 13]]])
    assert assign_targets(tiny, ANCHORS, STRIDE, 4, 4).count == 0
    assert assign_targets(tiny, ANCHORS, STRIDE, 4, 4, anchor_t=5.0).count > 0
    wide = np.array([[[0, 0, 10, 40, 18]]])  # 40 × 8: 10 / 8 is fine but 40 / 10 is not below 4 for (10, 13)
    assert set(assign_targets(wide, ANCHORS, STRIDE, 4, 4).anchor.tolist()) == {1, 2}
    assert set(assign_targets(wide, ANCHORS, STRIDE, 4, 4, anchor_t=3.0).anchor.tolist()) == {2}  # 30 / 8 > 3
