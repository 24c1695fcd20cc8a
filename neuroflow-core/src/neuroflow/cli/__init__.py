"""The ``neuroflow`` command line: train, plugins/backends, gradcheck, debug-backward, doctor."""

from neuroflow import blas_idle

blas_idle.prepare()  # before numpy loads: how long OpenBLAS's idle threads spin (see neuroflow.blas_idle)

from neuroflow.cli.main import build_parser, main  # noqa: E402 - after prepare(), which must precede numpy

__all__ = ["build_parser", "main"]
