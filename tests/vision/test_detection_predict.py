"""``neuroflow predict``'s pictures as a user hands them over: grey 8/16-bit PNG, colour PNG, JPEG, another size
(letterboxed, boxes mapped back), a directory, a missing or broken file; labels of nearby boxes drawn apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neuroflow.cli.predict import as_channels, letterbox, matplotlib_modules, place_label, read_picture
from neuroflow.errors import ConfigError

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("matplotlib")


@pytest.fixture
def grey() -> np.ndarray:
    return (np.arange(48 * 40, dtype=np.float32).reshape(48, 40) % 251) / 255.0


def test_grey_8_and_16_bit_pngs_and_jpegs_read_alike(grey: np.ndarray, tmp_path: Path) -> None:
    eight = np.round(grey * 255).astype(np.uint8)
    PIL.fromarray(eight, "L").save(tmp_path / "g8.png")
    PIL.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "g16.png")
    PIL.fromarray(eight, "L").save(tmp_path / "g.jpg", quality=100)
    PIL.fromarray(eight, "L").convert("LA").save(tmp_path / "la.png")  # grey with alpha
    for name in ("g8.png", "g16.png", "la.png"):
        image = read_picture(tmp_path / name)
        assert image.dtype == np.float32 and image.shape == (48, 40), name
        np.testing.assert_allclose(image, eight / 255.0, atol=1e-6, err_msg=name)
    jpeg = read_picture(tmp_path / "g.jpg")  # integers, not floats, from matplotlib: scaled into [0, 1] too
    assert jpeg.shape == (48, 40) and 0.0 <= jpeg.min() and jpeg.max() <= 1.0
    np.testing.assert_allclose(jpeg, eight / 255.0, atol=0.05)


def test_a_dark_jpeg_is_not_left_at_the_integer_scale(tmp_path: Path) -> None:
    PIL.fromarray(np.ones((16, 16), np.uint8), "L").save(tmp_path / "dark.jpg", quality=100)  # every value 1 of 255
    assert read_picture(tmp_path / "dark.jpg").max() < 0.01


def test_colour_pictures_become_grey_for_a_one_channel_detector(grey: np.ndarray, tmp_path: Path) -> None:
    colour = np.stack([grey, grey * 0.5, grey * 0.25], axis=-1)
    PIL.fromarray(np.round(colour * 255).astype(np.uint8), "RGB").save(tmp_path / "rgb.png")
    image = read_picture(tmp_path / "rgb.png")
    assert image.shape == (48, 40, 3)
    made_grey = as_channels(image, 1)
    assert made_grey.shape == (48, 40) and made_grey.dtype == np.float32
    np.testing.assert_allclose(made_grey, image @ np.array([0.299, 0.587, 0.114]), rtol=1e-5)
    assert as_channels(made_grey, 3).shape == (48, 40, 3) and as_channels(image, None) is image


def test_other_sizes_are_letterboxed_and_a_detector_sized_picture_is_left_alone(grey: np.ndarray) -> None:
    same, scale = letterbox(grey[:40], 40)
    assert scale == 1.0 and same is not None and same.shape == (40, 40)
    boxed, scale = letterbox(grey, 96)  # 48 high, 40 wide: scaled by 2 to 96 x 80, padded to 96 x 96
    assert scale == 2.0 and boxed.shape == (96, 96) and boxed.dtype == np.float32
    assert (boxed[:, 80:] == 0).all()
    # bilinear: output pixel 2i+1 samples the picture at i + 0.25 along each axis
    rows = 0.75 * grey[:47] + 0.25 * grey[1:]
    expected = 0.75 * rows[:, :39] + 0.25 * rows[:, 1:]
    np.testing.assert_allclose(boxed[1:94:2, 1:78:2], expected, rtol=1e-5, atol=1e-6)
    flat = np.full((30, 60), 0.4, np.float32)  # a constant picture stays constant where it is drawn
    small, scale = letterbox(flat, 16)
    assert scale == pytest.approx(16 / 60) and small.shape == (16, 16)
    np.testing.assert_allclose(small[:8], 0.4, rtol=1e-6)
    assert (small[8:] == 0).all()
    colour, _ = letterbox(np.zeros((10, 20, 3), np.float32), 32)
    assert colour.shape == (32, 32, 3)


def test_bad_pictures_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        read_picture(tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        read_picture(tmp_path / "none.png")
    (tmp_path / "bad.png").write_bytes(b"not a picture")
    with pytest.raises(ConfigError, match="cannot read .*bad.png"):
        read_picture(tmp_path / "bad.png")


def test_labels_of_boxes_close_together_are_moved_apart() -> None:
    matplotlib = matplotlib_modules()
    fig = matplotlib.pyplot.figure(figsize=(4.8, 4.8), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(np.zeros((96, 96)), cmap="gray")
    renderer = fig.canvas.get_renderer()
    placed: list = []
    labels = [ax.text(x, y, "8 0.43", fontsize=9, va="bottom", bbox={"pad": 1}) for x, y in
              [(48, 69), (47.8, 69.9), (48.5, 70.2), (93, 30)]]
    for label in labels:
        place_label(label, placed, renderer)
    extents = [label.get_window_extent(renderer) for label in labels]
    for i, a in enumerate(extents):
        for b in extents[i + 1:]:
            assert not a.overlaps(b)
    assert extents[3].x1 <= fig.bbox.x1 + 1e-6  # a label at the right edge stays inside the picture
    matplotlib.pyplot.close(fig)
