"""The ``neuroflow`` command line: train, plugins/backends, gradcheck, debug-backward, doctor."""

from neuroflow.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
