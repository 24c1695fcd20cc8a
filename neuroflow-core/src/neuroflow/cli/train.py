"""``neuroflow train CONFIG.toml``: build everything from a config, fit, report test metrics, optionally save."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from neuroflow import registry
from neuroflow.checkpoint import latest_checkpoint, save
from neuroflow.cli.arguments import positive_int
from neuroflow.config import Config, SeriesWindows, load_config
from neuroflow.errors import ConfigError
from neuroflow.lora import fuse
from neuroflow.trainer.communicator import open_communicator, requested_communicator
from neuroflow.trainer.data_parallel import DataParallel
from neuroflow.trainer.options import TrainerOptions

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
    parser.add_argument("--max-steps", type=positive_int, help="override the config's max_steps: stop after this "
                                                               "many optimisation steps")
    parser.add_argument("--nproc", type=positive_int, metavar="N",
                        help="train data-parallel in N processes started with MPI's mpiexec (needs "
                             "neuroflow-distributed: pip install 'neuroflow-distributed[mpich]')")


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


def _worker_argv(args: argparse.Namespace) -> list[str]:
    """This command's arguments for each of the ``--nproc`` workers: the same, less ``--nproc``."""
    argv = ["train", str(args.config)]
    for flag, value in (("--epochs", args.epochs), ("--device", args.device), ("--batch-size", args.batch_size),
                        ("--save", args.save), ("--max-steps", args.max_steps)):
        if value is not None:
            argv += [flag, str(Path(value).resolve()) if flag == "--save" else str(value)]
    return [*argv, "--resume"] if args.resume else argv


def _launch(args: argparse.Namespace, config: Config) -> int:
    """Start ``args.nproc`` workers of this command through the communicator's ``launch`` (neuroflow-distributed's
    ``mpi`` starts them with ``mpiexec``); the core only looks the communicator up by its entry-point name."""
    name = config.trainer.get("distributed") or "auto"
    name = "mpi" if name == "auto" else name
    factory = registry.communicators.get(name)  # not installed: the error says to install neuroflow-distributed
    launch = getattr(factory, "launch", None)
    if launch is None:
        raise ConfigError(f"communicator {name!r} cannot start processes itself; start them with your launcher "
                          f"(mpiexec -n {args.nproc} neuroflow train {args.config})")
    batch = int(config.trainer.get("batch_size", TrainerOptions.batch_size))
    if batch < args.nproc:  # else every rank fails alike on its first batch
        raise ConfigError(f"--nproc {args.nproc} shares each batch among {args.nproc} ranks, but the batch has "
                          f"{batch} sample(s); use --batch-size {args.nproc} or more, or fewer processes")
    code = int(launch(args.nproc, _worker_argv(args), name))
    if code != 0:
        _advise_resume(config)
    return code


def _advise_resume(config: Config) -> None:
    """After a run that failed: say that ``--resume`` continues it, when the config's checkpoint_dir holds one."""
    directory = config.trainer.get("checkpoint_dir")
    latest = None if directory is None else latest_checkpoint(config.path(directory))
    if latest is not None:
        print(f"neuroflow: the last checkpoint ({latest}) is intact: run the same command with --resume to continue "
              f"from it", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _ranks_met(config: Config) -> Iterator[None]:
    """Under a launcher, the run's communicator is opened first, for as long as the run: every rank has then met
    the others (MPI's initialisation waits for all of them), so a rank that fails later, on its own (a data file
    missing on its host), ends every rank instead of leaving them waiting in that initialisation for ever."""
    name = requested_communicator(config.trainer.get("distributed"))
    if name is None:
        yield
        return
    parallel = DataParallel(open_communicator(name))
    try:
        with parallel.guard():  # a failure on one rank aborts every rank, naming it
            yield
    finally:
        parallel.close()


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config).with_overrides(epochs=args.epochs, device=args.device,
                                                     batch_size=args.batch_size, max_steps=args.max_steps)
    if args.resume and "checkpoint_dir" not in config.trainer:
        raise ConfigError("--resume needs checkpoint_dir = \"...\" in the config: the directory the run's "
                          "checkpoints were written to")
    if args.nproc is not None:
        return _launch(args, config)
    if "distributed" not in config.trainer:  # under mpiexec (or --nproc) the ranks find each other
        config = config.with_overrides(distributed="auto")
    if args.save is not None:  # made absolute, so it is not taken relative to the config file
        config = dataclasses.replace(config, output={**(config.output or {}), "save": str(Path(args.save).resolve())})
    _saver(config)  # checked before training, not after
    with _ranks_met(config):
        train, test = config.build_data()
        if config.validate and test is not None and len(test) == 0:
            raise ConfigError("validate = true evaluates the test split after every epoch, but the config's [data] "
                              "gives an empty one (0 samples); give it samples ([data] n_test = 100 for a data set, "
                              "rows in the test .npz) or set validate = false")
        model = config.build_model(train)
        trainer = config.build_trainer(model)
        say = print if trainer.is_root else _quiet
        _train(args, config, trainer, model, train, test, say)
    return 0


def _quiet(*args: Any, **kwargs: Any) -> None:
    """``print`` on the ranks other than 0."""


def _train(args: argparse.Namespace, config: Config, trainer: Any, model: Any, train: Any, test: Any,
           say: Callable[..., None]) -> None:
    output = config.output or {}
    test_size = "no" if test is None else str(len(test))
    say(f"model: {model!r}")
    say(f"data: {len(train)} training and {test_size} test samples; device {trainer.backend.device}, "
        f"batch {trainer.batch_size}, {config.epochs} epoch(s){_ranks(trainer)}", flush=True)
    if args.resume:
        info = trainer.resume()
        say(f"resumed from {info.path} at step {info.step} (epoch {info.epoch}){_ranks_note(info, trainer)}",
            flush=True)
    history = trainer.fit(train, epochs=config.epochs, val_data=test if config.validate else None)
    if history.interrupted:
        say("training interrupted; reporting the model as it is")
    if output.get("fuse"):
        model = trainer.model = fuse(model)
        say("fused the LoRA adapters into the base weights")
    saved = _save(config, trainer, model)  # before the test: a failing evaluation must not lose the training
    try:
        _test(trainer, test, say)
    finally:
        if saved is not None:  # said last, after the metrics, where a user looks for it
            say(f"saved the model to {saved}")


def _save(config: Config, trainer: Any, model: Any) -> Path | None:
    """Write ``model`` where ``[output] save`` says (rank 0 alone); the path written, or None."""
    save, output = _saver(config), config.output or {}
    if save is None or not trainer.is_root:
        return None
    path = config.path(output["save"])
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"quantize": output["quantize"]} if "quantize" in output else {}
    training = model.training
    model.eval()  # the file records the mode, and nf.load restores it: a finished model loads ready to predict
    try:
        save(model, path, **options)
    finally:
        model.train(training)
    return path


def _test(trainer: Any, test: Any, say: Callable[..., None]) -> None:
    """Report the trained model's metrics on the held-out split, if there is one with samples."""
    if test is None:
        return
    if len(test) == 0:
        say("test: the test split is empty; nothing to evaluate")
        return
    metrics = trainer.evaluate(test)
    say("test: " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))
    if isinstance(test, SeriesWindows) and trainer.is_root:
        _report_forecast(trainer, test)


def _ranks(trainer: Any) -> str:
    parallel = trainer.parallel
    if parallel is None or parallel.size == 1:  # distributed = "mpi" under plain python: one process, as without
        return ""
    return f", {parallel.size} ranks (the batch is the global one, shared by the ranks)"


def _ranks_note(info: Any, trainer: Any) -> str:
    """What resuming a checkpoint written by another number of ranks means (nothing when the number is the same).

    Allowed: the global batches, their order and the optimizer's state do not depend on the number of ranks,
    so training continues where it stopped. Only the order in which the ranks' gradients are added changes,
    and with it the last bits of the weights.
    """
    now = 1 if trainer.parallel is None else int(trainer.parallel.size)
    then = getattr(info, "ranks", None)
    if then is None or then == now:
        return ""
    return (f"; the checkpoint was written by {then} rank(s) and training continues with {now}: the same global "
            f"batches in the same order, but the gradients are summed in another order, so the weights match a "
            f"run that kept {then} rank(s) to rounding, not bit for bit")
