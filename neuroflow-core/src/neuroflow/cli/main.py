"""Entry point of ``neuroflow`` / ``neuroflow-cli``: builds the commands and turns errors into exit codes.

Built-in commands register through the same ``register(name, help,
configure, run)`` callback that plugins get from the
``neuroflow_register_commands`` hook.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import neuroflow
from neuroflow.cli import (
    bench,
    debug_backward,
    doctor,
    evaluate,
    export,
    gradcheck,
    mem_profile,
    plugins,
    predict,
    train,
)
from neuroflow.cli.exit_codes import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE
from neuroflow.errors import ConfigError, NeuroFlowError, UnknownNameError
from neuroflow.plugins import hook_failed, plugin_manager

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

TRACEBACK_ENV = "NEUROFLOW_TRACEBACK"


def _builtin_commands(register: Callable[..., None]) -> None:
    register("train", train.HELP, train.configure, train.run)
    register("evaluate", evaluate.HELP, evaluate.configure, evaluate.run)
    register("predict", predict.HELP, predict.configure, predict.run)
    register("mem-profile", mem_profile.HELP, mem_profile.configure, mem_profile.run)
    register("plugins", plugins.HELP, plugins.configure, plugins.run)
    register("backends", plugins.BACKENDS_HELP, plugins.configure, plugins.run_backends)
    register("gradcheck", gradcheck.HELP, gradcheck.configure, gradcheck.run)
    register("debug-backward", debug_backward.HELP, debug_backward.configure, debug_backward.run)
    register("doctor", doctor.HELP, doctor.configure, doctor.run)
    register("export", export.HELP, export.configure, export.run)
    register("bench", bench.HELP, bench.configure, bench.run)


def _plugin_commands(register: Callable[..., None]) -> None:
    """Let every plugin add commands; a plugin that raises is reported and skipped."""
    manager = plugin_manager()
    for impl in manager.hook.neuroflow_register_commands.get_hookimpls():
        try:
            impl.function(*[register if name == "register" else None for name in impl.argnames])
        except Exception as exc:  # a broken plugin must not take the CLI down
            hook_failed(impl.plugin_name, impl.plugin, "neuroflow_register_commands", exc)  # neuroflow plugins shows it
            print(f"neuroflow: skipping commands of plugin {impl.plugin_name!r}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with the built-in commands and those plugins register."""
    parser = argparse.ArgumentParser(
        prog="neuroflow",
        description="NeuroFlow: memory-aware neural-network training on ordinary hardware.",
    )
    parser.add_argument("--version", action="version", version=f"neuroflow {neuroflow.__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    builtin: set[str] = set()

    def add(name: str, help: str, configure: Configure, run: Run) -> None:
        if name in commands.choices:
            kind = "a built-in" if name in builtin else "another plugin's"
            print(f"neuroflow: ignoring plugin command {name!r}: it is {kind} command", file=sys.stderr)
            return
        sub = commands.add_parser(name, help=help, description=help)
        configure(sub)
        sub.set_defaults(run=run)

    _builtin_commands(add)
    builtin.update(commands.choices)
    _plugin_commands(add)
    return parser


def _message(exc: BaseException, one_line: bool) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(line.strip() for line in text.splitlines()) if one_line else text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``) and return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits for --help and for bad arguments; return its code instead
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    run: Any = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print("neuroflow: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `neuroflow plugins | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (NeuroFlowError, OSError) as exc:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            traceback.print_exc()
        usage = isinstance(exc, ConfigError | UnknownNameError)
        print(f"neuroflow: error: {_message(exc, one_line=usage)}", file=sys.stderr)
        return EXIT_USAGE if usage else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
