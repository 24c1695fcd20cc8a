"""Evaluation and prediction: the model in eval mode on the session's buffers, its training mode restored after.

Each call holds the session for its whole length: calls from several threads take turns (see
:class:`~neuroflow.trainer.session.MemorySession`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from neuroflow import folding
from neuroflow.errors import ConfigError
from neuroflow.losses.evaluation import Evaluator, evaluator_of
from neuroflow.operator import Operator
from neuroflow.trainer.session import MemorySession


@contextlib.contextmanager
def inference_mode(session: MemorySession) -> Iterator[Operator]:
    """The model on the backend, loaded, in eval mode and on the session's buffers; its mode restored after.

    The whole call holds the session's lock: a call from another thread (a
    prediction, or a training step) waits until this one has ended, so one
    call sees one set of weights and its outputs are its own.
    """
    with session.lock:
        session.place_for_inference()
        model = session.model
        was_training = model.training
        model.eval()
        try:
            with session.lend(), folding.folding():  # what runs here has no backward: normalisations fold
                yield model
        finally:
            model.train(was_training)


def evaluate(session: MemorySession, loader: Any, classification: bool,
             evaluator: Evaluator | None = None,
             reduce: Callable[[list[float]], list[float]] | None = None) -> dict[str, float]:
    """Mean loss (and accuracy when ``classification``) over the batches of ``loader``, and the metrics of
    ``evaluator`` (default: a new one from the loss's ``evaluator()``, if it has one: a detector's mAP@0.5)."""
    backend, loss = session.backend, session.loss
    loss_sum, correct, seen = 0.0, 0, 0
    evaluator = evaluator if evaluator is not None else evaluator_of(loss)
    with inference_mode(session) as model:
        for x, y in loader:
            if not len(x):  # a data-parallel rank past the rows of a last batch shorter than the ranks
                continue
            xd, yd = backend.from_host(x), backend.from_host(y)
            out = model.forward(xd)
            loss_sum += loss.forward(out, yd) * len(x)
            if classification:
                # the logits are small ((batch, classes)): counting on the host costs one read, no launches
                correct += int((backend.to_host(out).argmax(axis=1) == y).sum())
            if evaluator is not None:
                evaluator.add(np.asarray(backend.to_host(out)), np.asarray(y))
            seen += len(x)
    if reduce is not None:  # a data-parallel run: the sums of every rank's rows
        loss_sum, hits, rows = reduce([loss_sum, float(correct), float(seen)])
        correct, seen = int(round(hits)), int(round(rows))
    if seen == 0:
        raise ConfigError("evaluate got no data")
    metrics = {"loss": loss_sum / seen}
    if classification:
        metrics["accuracy"] = correct / seen
    if evaluator is not None:
        metrics.update(evaluator.result())
    return metrics


def predict(session: MemorySession, x: np.ndarray, batch_size: int) -> np.ndarray:
    """The loss's predictions (class probabilities for CrossEntropy) for host array ``x``, as a host array."""
    backend, loss = session.backend, session.loss
    parts = []
    with inference_mode(session) as model:
        for start in range(0, len(x), batch_size):
            out = model.forward(backend.from_host(x[start:start + batch_size]))
            parts.append(np.array(backend.to_host(loss.predictions(out)), copy=True))
    if not parts:
        raise ConfigError("predict got an empty batch")
    return np.concatenate(parts)
