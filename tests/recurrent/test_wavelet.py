"""The db4 transform matrices: orthogonal, exact projections, and equal to PyWavelets' transforms."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from neuroflow_ops_recurrent import wavelet

SHAPES = [(2, 1), (4, 2), (8, 3), (16, 1), (16, 2), (32, 3), (64, 4)]


@pytest.mark.parametrize(("length", "levels"), SHAPES)
def test_dwt_matrix_is_orthogonal_and_bands_partition_the_identity(length: int, levels: int) -> None:
    w = wavelet.dwt_matrix(length, levels)
    np.testing.assert_allclose(w @ w.T, np.eye(length), atol=1e-12)
    bands = wavelet.mra_matrices(length, levels)
    np.testing.assert_allclose(bands.sum(axis=0), np.eye(length), atol=1e-12)
    for band in bands:  # orthogonal projections: symmetric and idempotent
        np.testing.assert_allclose(band, band.T, atol=1e-12)
        np.testing.assert_allclose(band @ band, band, atol=1e-12)
    assert sum(wavelet.band_sizes(length, levels)) == length


def test_db4_filters_are_an_orthonormal_quadrature_mirror_pair() -> None:
    lo, hi = wavelet.db4_filters()
    assert lo.size == hi.size == 8
    assert np.dot(lo, lo) == pytest.approx(1.0) and np.dot(hi, hi) == pytest.approx(1.0)
    assert lo.sum() == pytest.approx(np.sqrt(2)) and hi.sum() == pytest.approx(0.0, abs=1e-12)
    for shift in (2, 4, 6):  # orthogonal to its own even shifts
        assert np.dot(lo[shift:], lo[:-shift]) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("length", "levels"), SHAPES)
def test_matrices_match_pywavelets(length: int, levels: int) -> None:
    pywt = pytest.importorskip("pywt")
    x = np.random.default_rng(length + levels).standard_normal(length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pywt warns when boundary effects reach every coefficient
        coefficients = pywt.wavedec(x, "db4", mode="periodization", level=levels)
        bands = pywt.mra(x, "db4", level=levels, transform="dwt", mode="periodization")
    assert [c.size for c in coefficients] == wavelet.band_sizes(length, levels)
    np.testing.assert_allclose(wavelet.dwt_matrix(length, levels) @ x, np.concatenate(coefficients), atol=1e-12)
    np.testing.assert_allclose(np.einsum("jts,s->jt", wavelet.mra_matrices(length, levels), x), np.stack(bands),
                               atol=1e-12)
    assert np.allclose(wavelet.DB4_DEC_LO, pywt.Wavelet("db4").dec_lo)
    assert np.allclose(wavelet.db4_filters()[1], pywt.Wavelet("db4").dec_hi)


def test_window_transform_applies_the_bands_to_every_feature() -> None:
    length, levels, features = 16, 2, 3
    x = np.random.default_rng(0).standard_normal((length, features))
    u = (wavelet.window_transform(length, levels, features) @ x.reshape(-1)).reshape(length, levels + 1, features)
    bands = wavelet.mra_matrices(length, levels)
    for j in range(levels + 1):
        np.testing.assert_allclose(u[:, j, :], bands[j] @ x, atol=1e-12)


def test_matrices_are_cached_and_read_only() -> None:
    assert wavelet.dwt_matrix(16, 2) is wavelet.dwt_matrix(16, 2)
    with pytest.raises(ValueError):
        wavelet.window_transform(16, 2, 1)[0, 0] = 1.0


@pytest.mark.parametrize(("length", "levels"), [(12, 3), (1, 1), (16, 0)])
def test_invalid_windows_are_refused(length: int, levels: int) -> None:
    with pytest.raises(ValueError, match="levels|multiple"):
        wavelet.dwt_matrix(length, levels)
