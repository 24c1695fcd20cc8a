"""DetectionDataset (images with fixed-shape box targets) and ``digit_canvases``, the data set a config names."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from neuroflow.errors import ShapeError
from neuroflow_ops_vision.detection.canvases import NUM_CLASSES, check_canvas_options, digit_canvases
from neuroflow_ops_vision.detection.targets import check_targets, pad_targets, unpad_targets


class DetectionDataset:
    """Images and their boxes for a DataLoader: ``ds[indices] -> (images, targets)``, targets ``(B, M, 5)``.

    ``images``: float ``(N, C, H, W)``; ``targets``: one ``(k, 5)`` array
    ``(class, x1, y1, x2, y2)`` per image, or an already padded ``(N, M, 5)``
    array; ``max_objects`` (M): the padded rows per image, by default the
    most any image has (the padded array's M); ``num_classes``: when given,
    class ids are checked against it. Targets are checked on construction
    (boxes inside the image, positive area, valid classes, one per image).

    >>> ds = DetectionDataset.canvases("train", 100, seed=0)
    >>> x, y = ds[np.arange(8)]
    >>> x.shape, y.shape
    ((8, 1, 96, 96), (8, 5, 5))
    """

    def __init__(self, images: Any, targets: Any, *, max_objects: int | None = None,
                 num_classes: int | None = None) -> None:
        self.images: np.ndarray = np.asarray(images)
        if self.images.ndim != 4 or self.images.dtype.kind != "f":
            raise ShapeError(f"DetectionDataset images must be a floating (N, C, H, W) array; "
                             f"got {self.images.dtype}{self.images.shape}")
        rows = check_targets(targets, count=len(self.images), size=self.images.shape[2:],
                             num_classes=num_classes)
        if max_objects is None:
            given = np.shape(targets)[1] if isinstance(targets, np.ndarray) and targets.ndim == 3 else 0
            max_objects = max([given, 1] + [len(r) for r in rows])
        self.targets: np.ndarray = pad_targets(rows, max_objects)
        self.max_objects = int(max_objects)
        self.num_classes = num_classes

    @classmethod
    def canvases(cls, split: str = "train", n: int = 1000, size: int = 96, max_objects: int = 5, seed: int = 0,
                 variant: str = "mnist", **options: Any) -> DetectionDataset:
        """The canvases :func:`~neuroflow_ops_vision.detection.canvases.digit_canvases` draws, as a data set
        padded to ``max_objects`` rows per image."""
        images, ground_truth = digit_canvases(split, n, size, max_objects, seed, variant, **options)
        return cls(images, ground_truth, max_objects=max_objects, num_classes=NUM_CLASSES)

    @property
    def ground_truth(self) -> list[np.ndarray]:
        """Each image's ``(k, 5)`` rows, without padding."""
        return unpad_targets(self.targets)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: Any) -> tuple[np.ndarray, np.ndarray]:
        """The images at ``index`` (an index array, a slice or an int) and their padded targets."""
        return self.images[index], self.targets[index]

    def __repr__(self) -> str:
        objects = int((self.targets[:, :, 0] >= 0).sum())
        return (f"DetectionDataset({len(self)} images {self.images.dtype}{list(self.images.shape[1:])}, "
                f"{objects} objects, max_objects={self.max_objects})")


class DigitCanvases:
    """Digit canvases as a config names them: ``[data] dataset = "digit_canvases"``.

    Keys: ``n_train`` and ``n_test`` (canvases in each set, from the MNIST
    training and test splits), ``size`` (pixels a side), ``max_objects``,
    ``variant`` (``"mnist"`` or ``"fashion"``), ``seed``, ``min_scale`` and
    ``max_scale`` (the sides a digit is resized to), ``noise``; see
    :func:`~neuroflow_ops_vision.detection.canvases.digit_canvases`.
    The targets are boxes, so the config names the loss (``[loss]``).
    """

    loss: ClassVar[str | None] = None

    def __init__(self, *, n_train: int = 10000, n_test: int = 1000, size: int = 96, max_objects: int = 5,
                 variant: str = "mnist", seed: int = 0, min_scale: int = 16, max_scale: int = 48,
                 noise: float = 0.08) -> None:
        self.options: dict[str, Any] = dict(size=size, max_objects=max_objects, seed=seed, variant=variant,
                                            scales=(min_scale, max_scale), noise=noise)
        for split, n in (("train", n_train), ("test", n_test)):
            check_canvas_options(split=split, n=n, **self.options)
        self.n_train, self.n_test = n_train, n_test

    def load(self) -> tuple[DetectionDataset, DetectionDataset]:
        """The training canvases and the held-out ones."""
        return (DetectionDataset.canvases("train", self.n_train, **self.options),
                DetectionDataset.canvases("test", self.n_test, **self.options))

    def load_test(self) -> DetectionDataset:
        """The held-out canvases alone (``neuroflow evaluate`` draws no training set)."""
        return DetectionDataset.canvases("test", self.n_test, **self.options)
