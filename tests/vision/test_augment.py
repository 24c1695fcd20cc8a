"""StreamAugmenter: seeded determinism, identity, exact flips and rotations, jitter, fill, errors."""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow_ops_vision import StreamAugmenter


@pytest.fixture
def batch(rng: np.random.Generator) -> np.ndarray:
    return rng.random((6, 3, 9, 11)).astype(np.float32)


def test_same_seed_same_batches(batch: np.ndarray) -> None:
    options = dict(rotation=20, scale=(0.8, 1.2), translate=(0.1, 0.2), hflip=0.5, brightness=0.3, contrast=0.3)
    a, b = StreamAugmenter(**options, seed=7), StreamAugmenter(**options, seed=7)
    first = [a(batch) for _ in range(3)]
    second = [b(batch) for _ in range(3)]
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[0], first[1])  # the stream moves on
    a.reset()
    np.testing.assert_array_equal(a(batch), first[0])
    assert not np.array_equal(StreamAugmenter(**options, seed=8)(batch), first[0])


def test_identity_parameters_return_the_input(batch: np.ndarray) -> None:
    out = StreamAugmenter(seed=0)(batch)
    np.testing.assert_array_equal(out, batch)
    assert out is not batch and out.dtype == batch.dtype


def test_resampling_with_identity_matrices_is_exact(batch: np.ndarray) -> None:
    aug = StreamAugmenter(rotation=30, seed=0)
    np.testing.assert_array_equal(aug.resample(batch, np.tile(np.eye(3), (len(batch), 1, 1))), batch)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_flips_are_exact(batch: np.ndarray, layout: str) -> None:
    x = batch if layout == "NCHW" else np.ascontiguousarray(batch.transpose(0, 2, 3, 1))
    w_axis, h_axis = (3, 2) if layout == "NCHW" else (2, 1)
    np.testing.assert_array_equal(StreamAugmenter(hflip=1.0, seed=0, layout=layout)(x), np.flip(x, w_axis))
    np.testing.assert_array_equal(StreamAugmenter(vflip=1.0, seed=0, layout=layout)(x), np.flip(x, h_axis))


def test_quarter_turn_on_a_square_image_is_a_rotation_of_the_array(rng: np.random.Generator) -> None:
    x = rng.random((4, 1, 7, 7)).astype(np.float32)
    aug = StreamAugmenter(rotation=90.0, seed=0)
    u = np.zeros((4, 8))  # the draws for angle −90°
    inverse = np.linalg.inv(aug.matrices(u, 7, 7))
    out = aug.resample(x, inverse)
    np.testing.assert_allclose(out, np.rot90(x, k=1, axes=(2, 3)), atol=1e-5)


def test_translation_shifts_and_fills(rng: np.random.Generator) -> None:
    x = rng.random((1, 1, 5, 8)).astype(np.float32)
    aug = StreamAugmenter(translate=(0.25, 0.0), fill=-1.0, seed=0)
    u = np.full((1, 8), 0.5)
    u[0, 2] = 1.0  # the largest shift right: 0.25 · 8 = 2 pixels
    out = aug.resample(x, np.linalg.inv(aug.matrices(u, 5, 8)))
    np.testing.assert_allclose(out[..., 2:], x[..., :-2], atol=1e-6)
    np.testing.assert_array_equal(out[..., :2], -1.0)


def test_colour_jitter_changes_brightness_and_contrast_per_sample(batch: np.ndarray) -> None:
    out = StreamAugmenter(brightness=0.5, contrast=0.5, seed=3)(batch)
    assert out.shape == batch.shape and out.dtype == batch.dtype
    ratios = out.reshape(len(out), -1).std(axis=1) / batch.reshape(len(batch), -1).std(axis=1)
    assert np.ptp(ratios) > 0.05  # each sample gets its own factors
    clipped = StreamAugmenter(brightness=0.9, clip=(0.0, 1.0), seed=3)(batch)
    assert clipped.min() >= 0.0 and clipped.max() <= 1.0


def test_geometry_keeps_the_statistics_of_a_smooth_image() -> None:
    rows, cols = np.meshgrid(np.linspace(0, 1, 32), np.linspace(0, 1, 32), indexing="ij")
    x = np.broadcast_to((rows + cols)[None, None], (8, 1, 32, 32)).astype(np.float32).copy()
    out = StreamAugmenter(rotation=10, scale=(0.95, 1.05), seed=0, fill=1.0)(x)
    assert abs(float(out.mean()) - float(x.mean())) < 0.05


def test_errors(batch: np.ndarray) -> None:
    with pytest.raises(ShapeError, match=r"StreamAugmenter got a batch of shape \(3, 9, 11\)"):
        StreamAugmenter(seed=0)(batch[0])
    with pytest.raises(ShapeError, match="dtype uint8"):
        StreamAugmenter(seed=0)(np.zeros((1, 1, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="scale must be"):
        StreamAugmenter(scale=(1.2, 0.8))
    with pytest.raises(ValueError, match="hflip is a probability"):
        StreamAugmenter(hflip=2.0)
    with pytest.raises(ValueError, match="unknown layout"):
        StreamAugmenter(layout="CHW")
