"""Loss functions: CrossEntropy (fused log-softmax) and MSE."""

from neuroflow.losses.base import Loss
from neuroflow.losses.cross_entropy import CrossEntropy
from neuroflow.losses.mse import MSE

__all__ = ["CrossEntropy", "Loss", "MSE"]
