"""An example third-party op package for NeuroFlow: ``Swish`` (SiLU with a trainable beta)."""

from neuroflow_ops_example.swish import Swish

__all__ = ["Swish"]
