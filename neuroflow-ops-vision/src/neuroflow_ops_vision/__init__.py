"""Convolutional networks for NeuroFlow: vision ops, model builders and a streaming augmenter.

Installing this distribution makes ``neuroflow.ops.Conv2d`` (and the other
ops) resolve through the ``neuroflow_ops`` entry points, without importing
this package first; ``resnet18`` and ``neuroflow_cnn`` are registered under
``neuroflow_models``.
"""

from neuroflow_ops_vision.attention import SqueezeExcite
from neuroflow_ops_vision.augment import StreamAugmenter
from neuroflow_ops_vision.batchnorm import BatchNorm2d
from neuroflow_ops_vision.concat import ChannelConcat
from neuroflow_ops_vision.conv import Conv2d
from neuroflow_ops_vision.layout import ConvertLayout
from neuroflow_ops_vision.models import BasicBlock, ResNet, neuroflow_cnn, resnet18
from neuroflow_ops_vision.pooling import AvgPool2d, GlobalAvgPool2d, MaxPool2d
from neuroflow_ops_vision.separable import DepthwiseConv2d, SeparableConv2d
from neuroflow_ops_vision.upsample import Upsample

__all__ = [
    "AvgPool2d", "BasicBlock", "BatchNorm2d", "ChannelConcat", "Conv2d", "ConvertLayout", "DepthwiseConv2d",
    "GlobalAvgPool2d", "MaxPool2d", "ResNet", "SeparableConv2d", "SqueezeExcite", "StreamAugmenter", "Upsample",
    "neuroflow_cnn", "resnet18",
]
