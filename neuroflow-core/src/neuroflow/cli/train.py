"""``neuroflow train CONFIG.toml``: build everything from a config, fit, report test metrics, optionally save."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from neuroflow.checkpoint import save
from neuroflow.cli.arguments import positive_int
from neuroflow.config import Config, SeriesWindows, load_config
from neuroflow.errors import ConfigError
from neuroflow.lora import fuse

HELP = "train a model described by a TOML config file"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="the training configuration")
    parser.add_argument("--epochs", type=positive_int, help="override the config's epochs")
    parser.add_argument("--device", help="override the config's device (cpu, cuda:0, opencl:0, auto)")
    parser.add_argument("--batch-size", type=positive_int, help="override the config's batch_size")
    parser.add_argument("--save", metavar="PATH", help="save the trained model to PATH (relative to the current "
                                                       "directory), overriding the config's [output] save")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in the config's checkpoint_dir")


def _saver(config: Config) -> Callable[..., Any] | None:
    """``neuroflow.save`` when ``[output] save`` asks for it; checked before training, not after."""
    if not config.output or "save" not in config.output:
        return None
    return save


def _report_forecast(trainer: Any, test: SeriesWindows) -> None:
    """The model's held-out error next to the persistence forecast's, in original units."""
    predictions = {"model": trainer.predict(test.x), "persistence": test.persistence()}
    mse = {name: float(np.mean((p - test.y) ** 2)) for name, p in predictions.items()}
    print(f"forecast on {len(test)} held-out windows, in original units "
          f"(the series was standardised with the training part's mean {test.mean:.4g} and std {test.std:.4g}):")
    for name, value in mse.items():
        print(f"  {name:<12} MSE {value * test.std ** 2:<10.4g} RMSE {math.sqrt(value) * test.std:<9.4g} "
              f"(standardised MSE {value:.4f})")
    ratio = mse["model"] / mse["persistence"]
    verdict = "beats" if ratio < 1 else "does not beat"
    print(f"the model {verdict} persistence: its MSE is {ratio:.2f}× persistence's")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config).with_overrides(epochs=args.epochs, device=args.device,
                                                     batch_size=args.batch_size)
    if args.save is not None:  # made absolute, so it is not taken relative to the config file
        config = dataclasses.replace(config, output={**(config.output or {}), "save": str(Path(args.save).resolve())})
    if args.resume and "checkpoint_dir" not in config.trainer:
        raise ConfigError("--resume needs checkpoint_dir = \"...\" in the config: the directory the run's "
                          "checkpoints were written to")
    save = _saver(config)
    output = config.output or {}
    model = config.build_model()
    trainer = config.build_trainer(model)
    train, test = config.build_data()
    test_size = "no" if test is None else str(len(test))
    print(f"model: {model!r}")
    print(f"data: {len(train)} training and {test_size} test samples; device {trainer.backend.device}, "
          f"batch {trainer.batch_size}, {config.epochs} epoch(s)", flush=True)
    if args.resume:
        info = trainer.resume()
        print(f"resumed from {info.path} at step {info.step} (epoch {info.epoch})", flush=True)
    history = trainer.fit(train, epochs=config.epochs)
    if history.interrupted:
        print("training interrupted; reporting the model as it is")
    if output.get("fuse"):
        model = trainer.model = fuse(model)
        print("fused the LoRA adapters into the base weights")
    if test is not None:
        metrics = trainer.evaluate(test)
        print("test: " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))
        if isinstance(test, SeriesWindows):
            _report_forecast(trainer, test)
    if save is not None:
        path = config.path(output["save"])
        path.parent.mkdir(parents=True, exist_ok=True)
        options = {"quantize": output["quantize"]} if "quantize" in output else {}
        save(model, path, **options)
        print(f"saved the model to {path}")
    return 0
