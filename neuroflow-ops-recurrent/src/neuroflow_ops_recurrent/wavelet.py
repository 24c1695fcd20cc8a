"""The Daubechies-4 discrete wavelet transform as constant matrices.

With periodic extension (PyWavelets' ``mode='periodization'``) the multilevel
DWT of a window of length N is an exactly orthogonal N×N matrix, so a layer
that transforms its input multiplies by a matrix built once per window length
and levels, and its backward multiplies by the transpose: there is no
per-step Jacobian to compute. Matrices are built on the host in float64,
cached, and returned read-only.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: Decomposition low-pass filter of Daubechies-4 (8 taps), as PyWavelets names and orders it ('db4').
DB4_DEC_LO = np.array([
    -0.010597401785069032, 0.0328830116668852, 0.030841381835560764, -0.18703481171909309,
    -0.027983769416859854, 0.6308807679298589, 0.7148465705529157, 0.2303778133088965,
])


def db4_filters() -> tuple[np.ndarray, np.ndarray]:
    """The db4 decomposition filters (low-pass, high-pass); the high-pass is the quadrature mirror."""
    lo = DB4_DEC_LO.copy()
    hi = lo[::-1] * np.array([(-1) ** (j + 1) for j in range(lo.size)])
    return lo, hi


def check_window(length: int, levels: int) -> None:
    """Raise ValueError unless a ``levels``-level periodized DWT is defined for ``length`` samples."""
    if levels < 1:
        raise ValueError(f"the wavelet transform needs levels >= 1; got {levels}")
    if length < 2 or length % (2**levels):
        raise ValueError(
            f"a {levels}-level periodized DWT needs a window that is a multiple of {2**levels}; got {length}"
        )


def _single_level(length: int) -> np.ndarray:
    """One analysis step on ``length`` samples: approximation rows, then detail rows."""
    lo, hi = db4_filters()
    half = length // 2
    matrix = np.zeros((length, length))
    for i in range(half):
        for j in range(lo.size):
            # PyWavelets' periodization aligns output i with input 2i + taps/2 (found by matching its output).
            column = (2 * i + lo.size // 2 - j) % length
            matrix[i, column] += lo[j]
            matrix[half + i, column] += hi[j]
    return matrix


@lru_cache(maxsize=64)
def dwt_matrix(length: int, levels: int) -> np.ndarray:
    """The orthogonal (length, length) matrix of ``pywt.wavedec(x, 'db4', mode='periodization', level=levels)``.

    Rows are the coefficients in wavedec's order: [cA_levels, cD_levels, …, cD_1] concatenated.
    """
    check_window(length, levels)
    matrix = np.eye(length)
    size = length
    for _ in range(levels):
        step = np.eye(length)
        step[:size, :size] = _single_level(size)
        matrix = step @ matrix
        size //= 2
    matrix.flags.writeable = False
    return matrix


def band_sizes(length: int, levels: int) -> list[int]:
    """Coefficient counts per band, in wavedec order: [cA_levels, cD_levels, …, cD_1]."""
    check_window(length, levels)
    coarsest = length >> levels
    return [coarsest] + [length >> level for level in range(levels, 0, -1)]


@lru_cache(maxsize=64)
def mra_matrices(length: int, levels: int) -> np.ndarray:
    """(levels + 1, length, length) projections of ``pywt.mra(x, 'db4', level, transform='dwt', mode='periodization')``.

    Band j of the multiresolution analysis is Wⱼᵀ Wⱼ x, where Wⱼ are the rows of
    :func:`dwt_matrix` for band j: each band is a full-length, time-aligned
    series, and the bands sum to x.
    """
    matrix = dwt_matrix(length, levels)
    bands = np.empty((levels + 1, length, length))
    start = 0
    for j, size in enumerate(band_sizes(length, levels)):
        rows = matrix[start:start + size]
        bands[j] = rows.T @ rows
        start += size
    bands.flags.writeable = False
    return bands


@lru_cache(maxsize=64)
def window_transform(length: int, levels: int, features: int) -> np.ndarray:
    """The map a WaveletElman applies to one flattened (length, features) window.

    Returns K of shape (length·(levels+1)·features, length·features) with
    ``u.reshape(-1) = K @ x.reshape(-1)`` where u[t, j·features + f] is band j
    of feature f at step t. K is block-diagonal over features (a Kronecker
    product with the identity), which keeps the whole transform one GEMM; its
    size grows with features², fine for the few channels of a time series.
    """
    bands = mra_matrices(length, levels)
    kernel = np.einsum("jts,fg->tjfsg", bands, np.eye(features))
    kernel = np.ascontiguousarray(kernel.reshape(length * (levels + 1) * features, length * features))
    kernel.flags.writeable = False
    return kernel
