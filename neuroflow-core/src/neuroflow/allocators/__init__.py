"""Allocators: where a backend's buffers come from. Found through ``neuroflow_allocators``."""

from neuroflow.allocators.base import Allocator

__all__ = ["Allocator"]
