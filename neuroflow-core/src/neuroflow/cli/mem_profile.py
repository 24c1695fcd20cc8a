"""``neuroflow mem-profile CONFIG.toml|NAME``: a training step's memory per layer, its predicted peak, and a plan for a budget.

Nothing trains: ``neuroflow.memory.profile`` traces one forward/backward on
zeros and places the buffers as the Trainer would. The model, loss and
optimizer come from the config (a registered model name gets the Trainer's
defaults, CrossEntropy and AdamW); the shape of one sample comes from
``--input-shape``, ``[model] input_shape``, the model, the ``[data]`` table,
or the first layer with parameters, in that order.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from neuroflow import registry
from neuroflow.cli.arguments import positive_float, positive_int, sample_shape_arg
from neuroflow.cli.exit_codes import EXIT_FAILURE
from neuroflow.config import Config, resolve_model_config
from neuroflow.errors import ConfigError, ShapeError
from neuroflow.memory.profile import named_leaves
from neuroflow.operator import Operator
from neuroflow.trainer import budget as budget_plan

HELP = "per-layer memory of a training step, its predicted peak, and the batch × accumulation that fits a budget"

#: One sample of each dataset ``[data] dataset = ...`` can name, flat and not.
DATASET_SAMPLES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "mnist": ((784,), (1, 28, 28)),
    "fashion_mnist": ((784,), (1, 28, 28)),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", metavar="CONFIG.toml|NAME",
                        help="a training config, or a registered model name (resnet18)")
    parser.add_argument("--model", dest="model_option", metavar="CONFIG.toml|NAME",
                        help="the same, as an option (neuroflow mem-profile --model resnet18)")
    parser.add_argument("--batch-size", type=positive_int, help="the batch to plan for (default: the config's, else 64)")
    parser.add_argument("--budget-mb", type=positive_float, metavar="M",
                        help="memory budget in MiB (default: the config's memory_budget_mb): the largest batch "
                             "that fits and a batch × gradient_accumulation_steps keeping the effective batch")
    parser.add_argument("--png", metavar="FILE", help="also write a heat-map of layers × memory kinds (needs matplotlib)")
    parser.add_argument("--input-shape", type=sample_shape_arg, metavar="C,H,W",
                        help="the shape of one sample, when the config does not say (3,32,32 for resnet18)")


def _first_layer_with_parameters(model: Operator) -> Operator | None:
    return next((leaf for _, leaf in named_leaves(model) if leaf.parameters()), None)


def sample_shape(config: Config, model: Operator, given: tuple[int, ...] | None) -> tuple[tuple[int, ...], str]:
    """One sample's shape and where it came from (said in the output and in errors)."""
    if given is not None:
        return given, "--input-shape"
    if config.input_shape is not None:
        return config.input_shape, "[model] input_shape"
    for holder, where in ((model, "the model"), (_builder(config), "the model builder")):
        shape = getattr(holder, "input_shape", None)
        if shape is not None:
            return tuple(int(s) for s in shape), f"{where}'s input_shape"
    data = config.data or {}
    if data.get("dataset") in DATASET_SAMPLES:
        flat, image = DATASET_SAMPLES[data["dataset"]]
        # The loaders' own default is flat = true.
        return (flat if data.get("flat", True) else image), f"[data] dataset = {data['dataset']!r}"
    first = _first_layer_with_parameters(model)
    if first is not None and hasattr(first, "in_features"):
        return (int(first.in_features),), f"the in_features of {first!r}"
    what = f"model {config.model['name']!r}" if "name" in config.model else "the model"
    raise ConfigError(f"cannot tell the input shape of {what}; pass --input-shape C,H,W (one sample, e.g. 3,32,32) "
                      "or set [model] input_shape = [...] in the config")


def _builder(config: Config) -> Any:
    if "name" not in config.model:
        return None
    return registry.models.get(config.model["name"])


def run(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.model_option is None):
        raise ConfigError("give the model once: neuroflow mem-profile CONFIG.toml|NAME (or --model CONFIG.toml|NAME)")
    if args.png and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--png needs matplotlib, which is not installed: pip install matplotlib (or leave out --png)")
    spec = args.model or args.model_option
    # The plan is computed on the host whatever device the config names, so a config for a GPU profiles anywhere.
    config = resolve_model_config(spec).with_overrides(device="cpu", batch_size=args.batch_size)
    model = config.build_model()
    trainer = config.build_trainer(model)  # the loss and optimizer training would use, defaults included
    sample, source = sample_shape(config, model, args.input_shape)
    budget = args.budget_mb if args.budget_mb is not None else trainer.options.memory_budget_mb
    batch, steps = trainer.batch_size, trainer.gradient_accumulation_steps
    try:
        # what the Trainer plans against (input the loop holds, the host margin), so both advise the same split
        report = budget_plan.profile_step(trainer.memory, batch, tuple(sample), steps, budget)
    except ShapeError as exc:
        raise ConfigError(f"the model does not take samples of shape {sample} (from {source}): {exc}") from exc
    parameters = sum(int(p.data.size) for p in model.parameters())
    print(f"model: {spec}, {parameters:,} parameters; samples of shape {sample} (from {source}); "
          f"loss {type(trainer.loss).__name__}, optimizer {type(trainer.optimizer).__name__}; "
          f"batch {batch} × accumulation {steps}")
    print(report)
    if args.png:
        report.to_png(args.png)
        print(f"heat-map written to {args.png}")
    # 1 when training under this budget would fail; the Trainer takes a split keeping the effective batch itself
    return EXIT_FAILURE if budget is not None and not report.fits() and report.suggestion is None else 0
