"""Datasets: what a DataLoader draws batches from, the in-memory ArrayDataset, and what a config names."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike


@runtime_checkable
class Dataset(Protocol):
    """Anything a DataLoader can batch: a length and a lookup by an array of sample indices."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]: ...


class DatasetSource(Protocol):
    """A data set a config file asks for by name: what a ``neuroflow_datasets`` entry point names (a class).

    ``[data] dataset = "mnist"`` looks the name up; the table's other keys are
    the constructor's keyword arguments, checked against its signature and
    annotations when the config is read. The constructor reads no data: it
    keeps its options and raises ValueError for a value it refuses, so a bad
    config fails before anything is loaded. A parameter annotated as a path
    (``str | os.PathLike[str]``) is given relative to the config file's
    directory. ``loss`` names the loss a config without ``[loss]`` trains with
    (a class of :mod:`neuroflow.losses`, such as ``"MSE"`` for a forecast), or
    is None for the Trainer's default. A plugin registers one in its
    ``pyproject.toml``::

        [project.entry-points.neuroflow_datasets]
        sunspots = "neuroflow_ops_recurrent.data.datasets:Sunspots"
    """

    loss: ClassVar[str | None]

    def load(self) -> tuple[Dataset, Dataset | None]:
        """The training set and the held-out one (None when the data set has none)."""
        ...

    # Optional: ``load_test()``, the held-out set alone, which ``neuroflow evaluate`` calls where a source has it
    # (Config.build_test_data) rather than building a training set it does not use.


class ArrayDataset:
    """Inputs (and optional targets) held as host numpy arrays, one sample per row of axis 0.

    >>> ds = ArrayDataset(np.zeros((100, 784), np.float32), np.arange(100))
    >>> x, y = ds[np.array([3, 7])]
    >>> x.shape, y.tolist()
    ((2, 784), [3, 7])
    """

    def __init__(self, x: ArrayLike, y: ArrayLike | None = None) -> None:
        self.x: np.ndarray = np.asarray(x)
        self.y: np.ndarray | None = None if y is None else np.asarray(y)
        if self.x.ndim == 0:
            raise ValueError(f"ArrayDataset got a scalar input {self.x!r}; expected an array with one sample per row")
        if self.y is not None:
            if self.y.ndim == 0:
                raise ValueError(f"ArrayDataset got a scalar target {self.y!r}; expected one target per sample")
            if len(self.y) != len(self.x):
                raise ValueError(f"ArrayDataset got {len(self.x)} inputs and {len(self.y)} targets")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The samples at ``index`` (an index array, a slice or an int) as ``(x, y)``; y is None without targets."""
        return self.x[index], None if self.y is None else self.y[index]

    def __repr__(self) -> str:
        targets = "no targets" if self.y is None else f"y {self.y.dtype}{list(self.y.shape)}"
        return f"ArrayDataset({len(self)} samples, x {self.x.dtype}{list(self.x.shape)}, {targets})"


def as_dataset(obj: Any) -> Dataset:
    """Turn what a user passes as data — a dataset, an ``(x, y)`` pair or an input array — into a Dataset."""
    if isinstance(obj, tuple | list):
        if len(obj) == 2:
            return ArrayDataset(obj[0], obj[1])
        what = f"a {len(obj)}-item {type(obj).__name__}"
    elif isinstance(obj, np.ndarray):
        return ArrayDataset(obj)
    elif isinstance(obj, Dataset) and not isinstance(obj, str | bytes | dict):
        return obj
    else:
        what = type(obj).__name__
    raise TypeError(
        f"expected a dataset (len() and indexing by an index array), an (x, y) pair or a numpy array; got {what}"
    )
