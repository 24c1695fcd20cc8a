"""The version of neuroflow-core (``neuroflow.__version__``), at the bottom so any layer can write it in a file."""

__version__ = "0.1.0"
