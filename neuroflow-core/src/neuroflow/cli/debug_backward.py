"""``neuroflow debug-backward --model CONFIG``: per-layer gradient norms and the first layer whose backward is wrong.

One forward/backward runs on a batch of the config's training data (random
data of the model's input shape when the data is unavailable). Then each
layer of a float64 copy of the model is checked against finite differences
on the activations that actually reach it, in order, and the first layer
that disagrees is named.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow.cli.arguments import positive_int
from neuroflow.cli.exit_codes import EXIT_FAILURE
from neuroflow.cli.table import format_table
from neuroflow.composites import Sequential
from neuroflow.config import Config, resolve_model_config
from neuroflow.errors import ConfigError, NeuroFlowError
from neuroflow.losses import CrossEntropy
from neuroflow.operator import Operator
from neuroflow.testing.gradcheck import gradcheck

HELP = "per-layer gradient norms and a finite-difference check naming the first layer whose backward is wrong"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="CONFIG.toml|NAME",
                        help="a training config, or a registered model name (resnet18)")
    parser.add_argument("--layer", metavar="TYPE", help="only layers of this type (class name, any case): linear")
    parser.add_argument("--batch-size", type=positive_int, help="samples in the forward/backward (default: config's)")
    parser.add_argument("--check-samples", type=positive_int, default=4,
                        help="samples in the finite-difference check (default: 4)")


def layers_of(model: Operator) -> list[Operator]:
    """The model's layers in execution order: nested Sequentials are opened, other composites kept whole."""
    if not isinstance(model, Sequential):
        return [model]
    return [leaf for layer in model.layers for leaf in layers_of(layer)]


def _input_shape(config: Config, model: Operator) -> tuple[int, ...]:
    """One sample's shape: ``[model] input_shape``, the model's ``input_shape``, or the first layer's inputs."""
    shape = config.input_shape or getattr(model, "input_shape", None)
    if shape is not None:
        return tuple(shape)
    first = layers_of(model)[0]
    if hasattr(first, "in_features"):
        return (int(first.in_features),)
    raise ConfigError(f"cannot tell the input shape of {type(first).__name__}; set [model] input_shape = [...] "
                      "(one sample, e.g. [3, 32, 32])")


def _batch(config: Config, model: Operator, loss: Any, size: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``(x, y, where from)``: the first samples of the training data, else random ones."""
    reason = "the config has no [data]"
    if config.data is not None:
        try:
            train, _ = config.build_data()
            x, y = train[np.arange(min(size, len(train)))]
            if y is not None:
                return np.asarray(x), np.asarray(y), f"the first {len(x)} training samples"
            reason = "the training data has no targets"
        except (NeuroFlowError, OSError) as exc:
            reason = str(exc).splitlines()[0]
    params = model.parameters()
    dtype = params[0].dtype if params else np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, *_input_shape(config, model))).astype(dtype)
    out = np.asarray(model.forward(x))
    if isinstance(loss, CrossEntropy) and out.ndim == 2:
        y = rng.integers(0, out.shape[1], size)
    else:
        y = rng.standard_normal(out.shape).astype(dtype)
    return x, y, f"random data of shape {x.shape} ({reason})"


def _reseed(layer: Operator) -> Callable[[], None]:
    """A function that restarts every seeded generator in ``layer`` (Dropout), so repeated forwards agree."""
    seeded: list[tuple[Operator, int]] = [
        (m, m.seed) for m in layer.modules()  # type: ignore[attr-defined]
        if isinstance(getattr(m, "rng", None), np.random.Generator) and isinstance(getattr(m, "seed", None), int)
    ]

    def reseed() -> None:
        for module, seed in seeded:
            module.rng = np.random.default_rng(seed)  # type: ignore[attr-defined]

    return reseed


def _norm(array: Any) -> str:
    return f"{float(np.linalg.norm(np.asarray(array, dtype=np.float64))):.4e}"


def gradient_norms(layers: list[Operator], loss: Any, x: np.ndarray, y: np.ndarray) -> tuple[float, list[list[str]]]:
    """The loss and, per layer, its output shape, ‖∂L/∂output‖ and each parameter's gradient norm."""
    for layer in layers:
        layer.train()
        layer.zero_grad()
    shapes = []
    h = x
    for layer in layers:
        h = layer.forward(h)
        shapes.append(tuple(h.shape))
    value = loss.forward(h, y)
    g = loss.backward()
    out_norms = [""] * len(layers)
    for i in reversed(range(len(layers))):
        out_norms[i] = _norm(g)
        g = layers[i].backward(g)
    rows = []
    for i, layer in enumerate(layers):
        params = "  ".join(f"{name} {_norm(p.grad)}" if p.grad is not None else f"{name} (frozen)"
                           for name, p in layer.named_parameters())
        rows.append([str(i), repr(layer), str(shapes[i]), out_norms[i], params or "-"])
    return value, rows


def first_wrong_layer(layers: list[Operator], x: np.ndarray, selected: set[int]) -> tuple[int, str] | None:
    """Check each selected layer of a float64 copy on the activations reaching it; the first failure or None."""
    copies = copy.deepcopy(layers)
    h = np.asarray(x, dtype=np.float64)
    for i, layer in enumerate(copies):
        layer.astype(np.float64)
        reseed = _reseed(layer)
        if i in selected:
            try:
                gradcheck(layer, [h], prepare=reseed)
            except Exception as exc:  # GradcheckError or a crash: either way this layer's backward is wrong
                return i, str(exc)
            print(f"  {i}  {layer!r}: ok", flush=True)
        reseed()
        h = np.array(layer.forward(h), dtype=np.float64, copy=True)
    return None


def run(args: argparse.Namespace) -> int:
    config = resolve_model_config(args.model)
    model = config.build_model()
    loss = config.build_loss() or CrossEntropy()
    layers = layers_of(model)
    selected = set(range(len(layers)))
    if args.layer:
        selected = {i for i, layer in enumerate(layers) if type(layer).__name__.lower() == args.layer.lower()}
        if not selected:
            present = sorted({type(layer).__name__ for layer in layers})
            raise ConfigError(f"no layer of type {args.layer!r} in the model; its layer types: {', '.join(present)}")
    size = args.batch_size or config.trainer.get("batch_size", 32)
    x, y, source = _batch(config, model, loss, size)
    value, rows = gradient_norms(layers, loss, x, y)
    print(f"forward/backward on {source}: loss {value:.6g}")
    header = ["#", "layer", "output", "‖∂L/∂output‖", "parameter gradient norms"]
    print(format_table([row for i, row in enumerate(rows) if i in selected], header))
    samples = min(args.check_samples, len(x))
    print(f"finite-difference check (float64, {samples} samples):")
    wrong = first_wrong_layer(layers, x[:samples], selected)
    if wrong is None:
        print("every checked layer's backward matches finite differences")
        return 0
    index, why = wrong
    print(f"  {index}  {layers[index]!r}: WRONG: {why}")
    print(f"first layer whose backward is wrong: {index} {layers[index]!r}")
    return EXIT_FAILURE
