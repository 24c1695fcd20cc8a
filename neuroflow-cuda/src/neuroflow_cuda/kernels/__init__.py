"""Fused CUDA kernels for NeuroFlow's hot paths, compiled with NVRTC on first use."""

from neuroflow_cuda.kernels.compile import KernelFamily

__all__ = ["KernelFamily"]
