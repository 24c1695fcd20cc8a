"""``neuroflow evaluate CONFIG --model FILE``: a saved model's metrics on the held-out split of the config's data.

It prints one ``name = value`` line per metric: the mean loss, the accuracy for
a classifier, and what the loss's evaluator adds (``mAP@0.5 = 0.93`` for a
detector; see :mod:`neuroflow.losses.evaluation`). ``--coco-json DIR`` asks the
evaluator to write the data it saw and the model's predictions into DIR (COCO
``ground_truth.json`` and ``detections.json`` for a detector), for tools such
as pycocotools.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

from neuroflow import registry
from neuroflow.checkpoint import load
from neuroflow.cli.arguments import positive_int
from neuroflow.config import Config, load_config
from neuroflow.errors import ConfigError, NeuroFlowError
from neuroflow.losses.evaluation import Evaluator, WritesCocoJson, evaluator_of
from neuroflow.trainer import Trainer

HELP = "evaluate a saved model on the held-out data of a TOML config (loss, accuracy, mAP@0.5, ...)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="the training configuration (its [data] and [loss])")
    parser.add_argument("--model", metavar="FILE", required=True, help="the saved model (neuroflow train --save)")
    parser.add_argument("--coco-json", metavar="DIR", help="write the evaluator's files (COCO ground truth and "
                                                           "detections for a detector) into DIR")
    parser.add_argument("--device", help="override the config's device (cpu, cuda:0, opencl:0, auto)")
    parser.add_argument("--batch-size", type=positive_int, help="override the config's batch_size")


def trained_model(config: Config, path: str, device: str | None = None, batch_size: int | None = None) -> Trainer:
    """A Trainer around the model saved at ``path``, with the config's loss and options (shared with predict)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--model: file {str(file)!r} not found; train and save one first "
                          "(neuroflow train CONFIG --save FILE)")
    config = config.with_overrides(device=device, batch_size=batch_size)
    model = load(file, device="cpu")
    _check_matches(config, model, file)
    trainer: Trainer = config.build_trainer(model)
    return trainer


def _check_matches(config: Config, model: Any, file: Path) -> None:
    """Refuse a model file built with other ``[model]`` numbers than the config's (``num_classes = 10`` against a
    12-class model): its outputs would be read with the wrong layout, or scored against the wrong classes. A key
    the config leaves out is compared with its builder's default, which is what the config builds."""
    defaults = _builder_defaults(config)
    for key, wanted in {**defaults, **config.model}.items():
        if isinstance(wanted, bool) or not isinstance(wanted, (int, float)):
            continue
        built = getattr(model, key, None)
        if isinstance(built, (int, float)) and not isinstance(built, bool) and built != wanted:
            given = "" if key in config.model else f" (the default of {config.model['name']}: the config leaves it out)"
            raise ConfigError(f"--model: {str(file)!r} was built with {key} = {built:g}, but the config's [model] "
                              f"has {key} = {wanted:g}{given}; use the config the model was trained with (or a "
                              "model trained with this one)")


def _builder_defaults(config: Config) -> dict[str, Any]:
    """The default arguments of the model builder ``[model] name`` names; none for a config without one (or whose
    builder is not installed: the model file, not the builder, makes the model here)."""
    if "name" not in config.model:
        return {}
    try:
        builder = registry.models.get(config.model["name"])
    except NeuroFlowError:
        return {}
    return {name: parameter.default for name, parameter in inspect.signature(builder).parameters.items()
            if parameter.default is not inspect.Parameter.empty}


def writable_directory(path: str, flag: str) -> Path:
    """Directory ``path``, created now (before a long run) and checked writable; a ConfigError naming ``flag``
    (the option that gave it) otherwise."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".neuroflow-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write into {path!r} ({exc.strerror or exc}); give a directory "
                          "you can write to") from None
    return directory


def _evaluator(loss: Any, coco_json: str | None) -> Evaluator | None:
    evaluator = evaluator_of(loss)
    if coco_json is not None and not isinstance(evaluator, WritesCocoJson):
        has = "has no evaluator" if evaluator is None else f"has an evaluator ({type(evaluator).__name__}) that writes no files"
        raise ConfigError(f"--coco-json: the loss {type(loss).__name__} {has}; only a loss whose evaluator writes "
                          "files (a detector's DetectionLoss) can give COCO json")
    return evaluator


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    trainer = trained_model(config, args.model, args.device, args.batch_size)
    evaluator = _evaluator(trainer.loss, args.coco_json)
    directory = None if args.coco_json is None else writable_directory(args.coco_json, "--coco-json")
    test = config.build_test_data()  # the training split is not needed: not built where the data set can skip it
    if test is None:
        raise ConfigError(f"{args.config}: the config's [data] has no held-out split to evaluate on; give "
                          "test = \"<file>.npz\" or a dataset that has a test split")
    if len(test) == 0:
        raise ConfigError(f"{args.config}: the config's [data] gives an empty held-out split (0 samples) to evaluate "
                          "on; give it samples ([data] n_test = 100 for a data set, rows in the test .npz)")
    metrics = trainer.evaluate(test, evaluator)
    print(f"evaluated {args.model} on {len(test)} held-out samples")
    for name, value in metrics.items():
        print(f"{name} = {value:.4f}")
    if directory is not None and isinstance(evaluator, WritesCocoJson):
        for written in evaluator.write_coco_json(directory):
            print(f"wrote {written}")
    return 0
