"""The detector's data: digit canvases, padded targets, DetectionDataset, the config source, k-means anchors and
the StreamAugmenter's box geometry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.config import load_config
from neuroflow.data import DataLoader, fashion_mnist, mnist
from neuroflow.errors import ConfigError, ShapeError
from neuroflow_ops_vision import StreamAugmenter
from neuroflow_ops_vision.detection.anchors import kmeans_anchors
from neuroflow_ops_vision.detection.canvases import INK_LEVEL, digit_canvases, resize_matrix
from neuroflow_ops_vision.detection.dataset import DetectionDataset, DigitCanvases
from neuroflow_ops_vision.detection.targets import check_targets, collate_detections, pad_targets, unpad_targets


def _has_fashion() -> bool:
    try:
        fashion_mnist("test")
    except FileNotFoundError:
        return False
    return True


# ---------------------------------------------------------------- canvases
def test_same_seed_same_canvases_and_each_split_and_seed_its_own() -> None:
    images, truth = digit_canvases("train", 40, seed=5)
    again, truth_again = digit_canvases("train", 40, seed=5)
    np.testing.assert_array_equal(images, again)
    assert all(np.array_equal(a, b) for a, b in zip(truth, truth_again, strict=True))
    assert images.shape == (40, 1, 96, 96) and images.dtype == np.float32 and 0 <= images.min() < images.max() <= 1
    assert not np.array_equal(digit_canvases("train", 40, seed=6)[0], images)
    assert not np.array_equal(digit_canvases("test", 40, seed=5)[0], images)
    # a longer run starts with the same canvases: canvas i depends on the seed, not on n
    np.testing.assert_array_equal(digit_canvases("train", 10, seed=5)[0], images[:10])


def _ink_crops(x: np.ndarray) -> dict[bytes, int]:
    """Each 28×28 image's ink (values at or above INK_LEVEL, the rest 0) cropped to its tight box, as bytes."""
    ink = np.where(x >= INK_LEVEL, x, 0).astype(np.float32)
    crops = {}
    for i, image in enumerate(ink):
        rows, cols = np.flatnonzero(image.any(axis=1)), np.flatnonzero(image.any(axis=0))
        crops[image[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].tobytes()] = i
    return crops


@pytest.mark.parametrize("split", ["train", "test"])
def test_canvases_hold_the_digits_of_their_own_split_with_their_labels(split: str) -> None:
    # at the digits' own size (28 px: no resampling), without noise or overlap, each box crops a real digit
    images, truth = digit_canvases(split, 30, scales=(28, 28), noise=0.0, max_overlap=0.0, seed=2)
    own, other = mnist(split, flat=False), mnist("test" if split == "train" else "train", flat=False)
    own_crops, other_crops = _ink_crops(own.x[:, 0]), set(_ink_crops(other.x[:, 0]))
    found = 0
    for image, rows in zip(images[:, 0], truth, strict=True):
        for cls, x1, y1, x2, y2 in rows.astype(int):
            crop = image[y1:y2, x1:x2].tobytes()
            assert crop in own_crops and crop not in other_crops
            assert own.y[own_crops[crop]] == cls
            found += 1
    assert found > 60


@pytest.mark.parametrize("variant", ["mnist", "fashion"])
def test_boxes_are_tight_around_the_ink_and_only_noise_lies_outside(variant: str) -> None:
    if variant == "fashion" and not _has_fashion():
        pytest.skip("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")
    noise = 0.05
    images, truth = digit_canvases("test", 60, size=80, max_objects=4, noise=noise, seed=1, variant=variant,
                                   max_overlap=0.3)
    check_targets(truth, count=60, size=80, num_classes=10)
    for image, rows in zip(images[:, 0], truth, strict=True):
        assert len(rows) <= 4
        outside = np.ones(image.shape, bool)
        for _, x1, y1, x2, y2 in rows.astype(int):
            outside[y1:y2, x1:x2] = False
            inside = image[y1:y2, x1:x2] >= INK_LEVEL
            # ink touches all four sides of its box (from this object or one overlapping it)
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            assert 16 * 0.2 < max(x2 - x1, y2 - y1) <= 48
        assert image[outside].max(initial=0) < noise
        for a in range(len(rows)):  # no box covers more than max_overlap of another
            for b in range(a + 1, len(rows)):
                w = min(rows[a, 3], rows[b, 3]) - max(rows[a, 1], rows[b, 1])
                h = min(rows[a, 4], rows[b, 4]) - max(rows[a, 2], rows[b, 2])
                areas = [(r[3] - r[1]) * (r[4] - r[2]) for r in (rows[a], rows[b])]
                assert max(w, 0) * max(h, 0) <= 0.3 * min(areas) + 1e-6


def test_object_counts_include_empty_canvases_and_never_exceed_max_objects() -> None:
    _, truth = digit_canvases("train", 200, max_objects=3, empty=0.25, seed=0)
    counts = np.bincount([len(rows) for rows in truth], minlength=4)
    assert len(counts) == 4 and counts[0] > 20 and counts[1:].min() > 20
    assert all(rows.shape[1] == 5 and rows.dtype == np.float32 for rows in truth)
    assert digit_canvases("test", 0)[0].shape == (0, 1, 96, 96)


@pytest.mark.parametrize(("options", "message"), [
    (dict(split="valid"), "split must be one of 'train', 'test'; got 'valid'"),
    (dict(variant="cifar"), "variant must be one of 'mnist', 'fashion'; got 'cifar'"),
    (dict(n=-1), "n must be an integer >= 0; got -1"),
    (dict(max_objects=0), "max_objects must be an integer >= 1; got 0"),
    (dict(size=40), r"scales must be integer sides .* <= size \(40\); got \(16, 48\)"),
    (dict(scales=(16,)), r"scales must be integer sides \(smallest, largest\) .*; got \(16,\)"),
    (dict(scales=16), r"scales must be integer sides \(smallest, largest\) .*; got 16"),
    (dict(scales=(48, 16)), r"1 <= smallest <= largest .*; got \(48, 16\)"),
    (dict(noise=0.5), r"noise must be in \[0, 0.1\]; got 0.5"),
    (dict(seed=1.5), "seed must be an integer >= 0; got 1.5"),
])
def test_bad_canvas_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        digit_canvases(**{"split": "train", "n": 2, **options})


def test_resize_matrix_is_an_antialiased_bilinear_resample() -> None:
    np.testing.assert_array_equal(resize_matrix(28, 28), np.eye(28))
    for n_out in (16, 28, 48):
        r = resize_matrix(28, n_out)
        np.testing.assert_allclose(r.sum(axis=1), 1.0)
        ramp = r @ np.arange(28.0)
        centres = (np.arange(n_out) + 0.5) * 28 / n_out - 0.5
        interior = (centres > 2) & (centres < 25)  # away from the edges a ramp is kept (exactly when enlarging)
        np.testing.assert_allclose(ramp[interior], centres[interior], atol=1e-9 if n_out >= 28 else 0.05)
        np.testing.assert_allclose(r[::-1, ::-1], r, atol=1e-12)  # symmetric: nothing shifts to one side
    assert (resize_matrix(28, 14) > 0).sum(axis=1).max() == 4  # shrinking widens the filter: no aliasing


# ---------------------------------------------------------------- targets
def test_pad_and_unpad_round_trip_with_empty_images_as_padding() -> None:
    truth = [np.array([[3, 1, 2, 10, 12], [0, 0, 0, 5, 5]], np.float32), np.zeros((0, 5)), np.array([[9, 4, 4, 8, 9]])]
    padded = pad_targets(truth, 3)
    assert padded.shape == (3, 3, 5) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded[1], [[-1, 0, 0, 0, 0]] * 3)
    np.testing.assert_array_equal(padded[0, 2], [-1, 0, 0, 0, 0])
    back = unpad_targets(padded)
    assert [len(r) for r in back] == [2, 0, 1]
    for a, b in zip(back, truth, strict=True):
        np.testing.assert_array_equal(a, np.asarray(b, np.float32).reshape(-1, 5))
    images, targets = collate_detections([(np.zeros((1, 4, 4)), t) for t in truth], 2)
    assert images.shape == (3, 1, 4, 4)
    np.testing.assert_array_equal(targets, padded[:, :2])
    assert [len(r) for r in check_targets(padded, count=3, size=12, num_classes=10)] == [2, 0, 1]


@pytest.mark.parametrize(("targets", "options", "error", "message"), [
    ([[[0, -1, 0, 4, 4]]], dict(size=8), ValueError, r"image 0, row 0: box \(-1, 0, 4, 4\) lies outside the 8×8 image"),
    ([[], [[0, 0, 0, 4, 9]]], dict(size=8), ValueError, r"image 1, row 0: box \(0, 0, 4, 9\) lies outside"),
    ([[[0, 1, 1, 4, 4], [0, 2, 2, 2, 6]]], {}, ValueError, r"image 0, row 1: box \(2, 2, 2, 6\) has zero or negative"),
    ([[[10, 0, 0, 4, 4]]], dict(num_classes=10), ValueError, r"class id 10 is out of range; .* \[0, 10\)"),
    ([[[-2, 0, 0, 4, 4]]], {}, ValueError, "class id -2 is out of range"),
    ([[[1.5, 0, 0, 4, 4]]], {}, ValueError, "class id 1.5 is out of range"),
    ([[[0, 0, np.nan, 4, 4]]], {}, ValueError, "image 0, row 0: ground truth holds NaN or Inf"),
    ([[], []], dict(count=3), ValueError, "got targets for 2 images but 3 images"),
    ([[[0, 0, 0, 4]]], {}, ShapeError, r"image 0: ground truth must have shape \(k, 5\) .* got \(1, 4\)"),
    ("boxes", {}, TypeError, "got str"),
])
def test_bad_targets_are_refused_naming_the_image_and_row(targets, options, error, message) -> None:
    with pytest.raises(error, match=message):
        check_targets(targets, **options)


def test_rows_of_zeros_are_named_as_padding_that_needs_class_minus_one() -> None:
    with pytest.raises(ValueError, match=r"image 0, row 0: box \(0, 0, 0, 0\) has zero or negative area; .*; a row "
                                         r"of zeros looks like padding, but padding rows must have class -1, "
                                         r"\(-1, 0, 0, 0, 0\), as pad_targets writes them"):
        DetectionDataset(np.zeros((3, 1, 16, 16), np.float32), np.zeros((3, 2, 5)))
    with pytest.raises(ValueError, match="zero or negative area") as refused:
        check_targets([[[0, 2, 2, 2, 6]]])  # a box of no width, not padding
    assert "padding" not in str(refused.value)


def test_pad_targets_refuses_more_objects_than_max_objects() -> None:
    with pytest.raises(ValueError, match="image 1 has 3 objects but max_objects is 2"):
        pad_targets([np.zeros((0, 5)), [[0, 0, 0, 1, 1]] * 3], 2)
    with pytest.raises(ValueError, match="max_objects must be a positive integer; got 0"):
        pad_targets([], 0)
    with pytest.raises(ShapeError, match=r"shape \(B, M, 5\); got \(2, 5\)"):
        unpad_targets(np.zeros((2, 5)))


# ---------------------------------------------------------------- dataset and config
def test_a_dataloader_batches_detection_datasets_with_fixed_shape_targets() -> None:
    ds = DetectionDataset.canvases("train", 50, size=64, max_objects=4, seed=3, scales=(12, 30))
    assert len(ds) == 50 and ds.max_objects == 4 and "50 images" in repr(ds)
    seen: list[np.ndarray] = []
    for x, y in DataLoader(ds, batch_size=16, shuffle=True, seed=0):
        assert x.shape[1:] == (1, 64, 64) and y.shape[1:] == (4, 5) and y.dtype == np.float32
        seen += unpad_targets(y)
    assert sorted(r.tobytes() for r in seen) == sorted(r.tobytes() for r in ds.ground_truth)
    x, y = ds[np.array([0, 2])]
    np.testing.assert_array_equal(y, pad_targets([ds.ground_truth[0], ds.ground_truth[2]], 4))
    assert DetectionDataset(x, unpad_targets(y)).max_objects == max(1, max(len(r) for r in unpad_targets(y)))
    with pytest.raises(ValueError, match="got targets for 1 images but 2 images"):
        DetectionDataset(x, [np.zeros((0, 5))])
    with pytest.raises(ValueError, match=r"lies outside the 64×64 image"):
        DetectionDataset(x, [[[0, 0, 0, 65, 3]], []])
    with pytest.raises(ShapeError, match=r"floating \(N, C, H, W\) array; got uint8"):
        DetectionDataset(x.astype(np.uint8), y)


def _config(tmp_path: Path, data: str) -> nf.config.Config:
    path = tmp_path / "detect.toml"
    path.write_text(f"[model]\nlayers = [{{type = 'Flatten'}}]\n[data]\ndataset = 'digit_canvases'\n{data}")
    return load_config(path)


def test_digit_canvases_load_through_the_config_layer(tmp_path: Path) -> None:
    config = _config(tmp_path, "n_train = 12\nn_test = 5\nsize = 64\nmax_objects = 3\nseed = 4\nmax_scale = 32")
    train, test = config.build_data()
    assert isinstance(train, DetectionDataset) and isinstance(test, DetectionDataset)
    assert (len(train), len(test)) == (12, 5) and train.images.shape[1:] == (1, 64, 64)
    assert train.targets.shape == (12, 3, 5)
    expected, _ = digit_canvases("test", 5, size=64, max_objects=3, seed=4, scales=(16, 32))
    np.testing.assert_array_equal(test.images, expected)
    assert DigitCanvases.loss is None  # the targets are boxes: the config names its loss


@pytest.mark.parametrize(("data", "message"), [
    ("variant = 'cifar'", "variant must be one of 'mnist', 'fashion'; got 'cifar'"),
    ("n_train = 'many'", "'n_train' must be an integer"),
    ("size = 32", r"scales must be .* <= size \(32\)"),
    ("n_tran = 5", "n_tran"),
])
def test_bad_digit_canvas_keys_fail_when_the_config_is_read(tmp_path: Path, data: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, data)


# ---------------------------------------------------------------- anchors
def test_kmeans_anchors_recover_planted_clusters_sorted_by_area() -> None:
    rng = np.random.default_rng(0)
    planted = np.array([[40.0, 36.0], [8.0, 20.0], [22.0, 12.0]])
    wh = np.repeat(planted, 200, axis=0) * rng.uniform(0.93, 1.07, (600, 2))
    corner = rng.uniform(0, 40, (600, 2))
    rows = np.concatenate([np.zeros((600, 1)), corner, corner + wh], axis=1)
    truth = [rows[i:i + 6] for i in range(0, 600, 6)]
    anchors = kmeans_anchors(truth, k=3, seed=1)
    assert anchors.dtype == np.float32 and anchors.shape == (3, 2)
    np.testing.assert_allclose(anchors, planted[[1, 2, 0]], rtol=0.03)
    np.testing.assert_array_equal(kmeans_anchors(truth, k=3, seed=1), anchors)
    np.testing.assert_array_equal(kmeans_anchors(pad_targets(truth, 6), k=3, seed=1), anchors)
    with pytest.raises(ValueError, match="at least k = 3 distinct box shapes; the ground truth has 2"):
        kmeans_anchors([np.array([[0, 0, 0, 4, 4], [1, 2, 2, 6, 6], [0, 0, 0, 3, 9]])], k=3)
    with pytest.raises(ValueError, match="k must be a positive integer; got 0"):
        kmeans_anchors(truth, k=0)


# ---------------------------------------------------------------- augmenter geometry on boxes
def _rectangles(boxes: np.ndarray, size: int) -> np.ndarray:
    """Images (N, 1, size, size) holding each box's solid rectangle (one box per image)."""
    x = np.zeros((len(boxes), 1, size, size), np.float32)
    for image, (x1, y1, x2, y2) in zip(x, boxes.astype(int), strict=True):
        image[0, y1:y2, x1:x2] = 1.0
    return x


def _measured(x: np.ndarray) -> np.ndarray:
    """Where the ink went: the box (x1, y1, x2, y2) of each image's pixels above one half."""
    found = []
    for image in x[:, 0]:
        rows, cols = np.flatnonzero((image > 0.5).any(axis=1)), np.flatnonzero((image > 0.5).any(axis=0))
        found.append([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1])
    return np.array(found, np.float64)


@pytest.mark.parametrize("options", [
    dict(hflip=1.0), dict(vflip=1.0), dict(scale=(0.6, 1.3)), dict(translate=(0.15, 0.15)),
    dict(rotation=25.0), dict(hflip=0.5, scale=(0.8, 1.2), translate=(0.1, 0.1), rotation=10.0),
], ids=["hflip", "vflip", "scale", "translate", "rotate", "all"])
def test_boxes_follow_their_objects(options: dict) -> None:
    rng = np.random.default_rng(1)
    size, n = 64, 12
    x1y1 = rng.integers(14, 30, (n, 2))
    boxes = np.concatenate([x1y1, x1y1 + rng.integers(6, 20, (n, 2))], axis=1).astype(np.float32)
    targets = pad_targets([np.array([[7, *b]]) for b in boxes], 2)
    aug = StreamAugmenter(**options, seed=3)
    x_aug, moved = aug(_rectangles(boxes, size), targets)
    assert moved.shape == targets.shape and moved.dtype == np.float32
    np.testing.assert_array_equal(moved[:, 0, 0], 7)
    np.testing.assert_array_equal(moved[:, 1], [[-1, 0, 0, 0, 0]] * n)
    np.testing.assert_allclose(moved[:, 0, 1:], _measured(x_aug), atol=1.0)


def test_boxes_are_clipped_to_the_image_and_small_or_hidden_ones_dropped() -> None:
    size, shift = 40, 12.0
    aug = StreamAugmenter(seed=0)
    forward = np.array([[[1.0, 0.0, shift], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    # a box that stays, one pushed half out of the image (clipped), one pushed (almost) all out (dropped)
    rows = np.array([[1, 4, 4, 10, 10], [2, 40 - shift - 6, 5, 40 - shift + 6, 15], [3, 40 - shift - 1, 20, 40, 30]])
    moved = aug.transform_boxes(pad_targets([rows], 4), forward, size, size)
    np.testing.assert_allclose(moved[0, 0], [1, 4 + shift, 4, 10 + shift, 10], atol=1e-4)
    np.testing.assert_allclose(moved[0, 1], [2, 40 - 6, 5, 40, 15], atol=1e-4)
    np.testing.assert_array_equal(moved[0, 2:], [[-1, 0, 0, 0, 0]] * 2)
    # the same box, clipped to 6 of its 12 pixels' width, is dropped when 60 % of it must remain visible
    strict = StreamAugmenter(min_box_visible=0.6, seed=0).transform_boxes(pad_targets([rows[1:2]], 1), forward,
                                                                          size, size)
    np.testing.assert_array_equal(strict, [[[-1, 0, 0, 0, 0]]])
    # shrinking: a 6-pixel box at a quarter of its size is under min_box_size = 2 pixels
    small = StreamAugmenter(scale=(0.25, 0.25), seed=0)
    _, moved = small(np.zeros((1, 1, size, size), np.float32), pad_targets([[[0, 0, 0, 6, 6], [1, 10, 10, 30, 30]]], 2))
    np.testing.assert_allclose(moved[0], [[1, 17.5, 17.5, 22.5, 22.5], [-1, 0, 0, 0, 0]])
    kept = StreamAugmenter(scale=(0.25, 0.25), min_box_size=1.0, seed=0)
    assert (kept(np.zeros((1, 1, size, size), np.float32), pad_targets([[[0, 0, 0, 6, 6]]], 1))[1][0, 0, 0]) == 0


def test_the_image_alone_is_augmented_as_before_and_labels_pass_through() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((4, 1, 16, 16)).astype(np.float32)
    options = dict(rotation=15, scale=(0.9, 1.1), translate=(0.1, 0.1), hflip=0.5, brightness=0.2, seed=9)
    alone = StreamAugmenter(**options)(x)
    assert isinstance(alone, np.ndarray)
    with_boxes, _ = StreamAugmenter(**options)(x, pad_targets([[[0, 2, 2, 9, 9]]] * 4, 1))
    np.testing.assert_array_equal(with_boxes, alone)
    labels = np.arange(4)
    x_aug, same = StreamAugmenter(**options)(x, labels)
    np.testing.assert_array_equal(x_aug, alone)
    assert same is labels
    aug = StreamAugmenter(**options)
    with pytest.raises(ShapeError, match=r"4 images and targets of shape \(3, 2, 5\)"):
        aug(x, np.zeros((3, 2, 5), np.float32))
    with pytest.raises(ShapeError, match=r"box targets must have shape \(N, M, 5\) .* got \(4, 2, 4\)"):
        aug(x, np.zeros((4, 2, 4), np.float32))
    np.testing.assert_array_equal(aug(x), alone)  # a refused call draws nothing
    with pytest.raises(ValueError, match="min_box_visible in"):
        StreamAugmenter(min_box_visible=2.0)


def test_the_trainer_hands_targets_to_an_augmenter_that_transforms_them() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype(np.float32), rng.integers(0, 3, 32)

    class Relabel:
        transforms_targets = True

        def __init__(self) -> None:
            self.seen: list[np.ndarray] = []

        def __call__(self, batch: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            self.seen.append(targets.copy())
            return batch, np.full_like(targets, 7)  # a class the model lacks: the loss must see these

    relabel = Relabel()
    nf.manual_seed(0)
    trainer = nf.Trainer(nf.Sequential(ops.Linear(6, 3)), batch_size=8, shuffle=False, progress=False,
                         augment=relabel)
    with pytest.raises(ShapeError, match=r"labels outside \[0, 3\): min 7, max 7"):
        trainer.fit((x, y), epochs=1)
    np.testing.assert_array_equal(relabel.seen[0], y[:8])
    images_only: list[tuple[int, ...]] = []
    nf.Trainer(nf.Sequential(ops.Linear(6, 3)), batch_size=8, progress=False,
               augment=lambda batch: images_only.append(batch.shape) or batch).fit((x, y), epochs=1)
    assert images_only == [(8, 6)] * 4
