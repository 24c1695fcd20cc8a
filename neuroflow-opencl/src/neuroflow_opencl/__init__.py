"""neuroflow-opencl: the ``opencl`` backend for NeuroFlow (Intel/AMD iGPUs, pocl on the CPU)."""

from neuroflow_opencl.backend import OpenclBackend

__all__ = ["OpenclBackend"]
