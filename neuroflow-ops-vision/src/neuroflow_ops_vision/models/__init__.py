"""Model builders, registered under ``neuroflow_models``: ``resnet18`` and ``neuroflow_cnn``."""

from neuroflow_ops_vision.models.cnn import neuroflow_cnn
from neuroflow_ops_vision.models.resnet import BasicBlock, ResNet, resnet18

__all__ = ["BasicBlock", "ResNet", "neuroflow_cnn", "resnet18"]
