"""The ``neuroflow`` command line: train, plugins/backends, gradcheck, debug-backward, doctor."""

from neuroflow.cli.main import build_parser, main  # importing neuroflow first prepares OpenBLAS (neuroflow.blas_idle)

__all__ = ["build_parser", "main"]
