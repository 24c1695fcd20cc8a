"""NeuroFlow's CUDA backend (``device="cuda:0"``), through CuPy; importing this never imports CuPy."""

from neuroflow_cuda.probe import unavailable_reason

__version__ = "0.1.0"
__all__ = ["__version__", "unavailable_reason"]
