"""``neuroflow train CONFIG.toml``: build everything from a config, fit, report test metrics, optionally save."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from neuroflow.cli.arguments import positive_int
from neuroflow.config import Config, load_config
from neuroflow.errors import ConfigError

HELP = "train a model described by a TOML config file"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="the training configuration")
    parser.add_argument("--epochs", type=positive_int, help="override the config's epochs")
    parser.add_argument("--device", help="override the config's device (cpu, cuda:0, opencl:0, auto)")
    parser.add_argument("--batch-size", type=positive_int, help="override the config's batch_size")


def _saver(config: Config) -> Callable[..., Any] | None:
    """``neuroflow.save`` when ``[output] save`` asks for it; checked before training, not after."""
    if not config.output or "save" not in config.output:
        return None
    try:
        from neuroflow import save
    except ImportError:
        raise ConfigError(
            "[output] save needs neuroflow.save (model files), which this neuroflow-core does not provide yet; "
            "remove [output] save from the config"
        ) from None
    return save


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config).with_overrides(epochs=args.epochs, device=args.device,
                                                     batch_size=args.batch_size)
    save = _saver(config)
    model = config.build_model()
    trainer = config.build_trainer(model)
    train, test = config.build_data()
    test_size = "no" if test is None else str(len(test))
    print(f"model: {model!r}")
    print(f"data: {len(train)} training and {test_size} test samples; device {trainer.backend.device}, "
          f"batch {trainer.batch_size}, {config.epochs} epoch(s)", flush=True)
    history = trainer.fit(train, epochs=config.epochs)
    if history.interrupted:
        print("training interrupted; reporting the model as it is")
    if test is not None:
        metrics = trainer.evaluate(test)
        print("test: " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))
    if save is not None and config.output is not None:
        path = config.path(config.output["save"])
        options = {"quantize": config.output["quantize"]} if "quantize" in config.output else {}
        save(model, path, **options)
        print(f"saved the model to {path}")
    return 0
