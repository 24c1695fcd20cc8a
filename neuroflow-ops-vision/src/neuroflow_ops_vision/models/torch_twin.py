"""PyTorch twins of the model builders, for side-by-side checks (tests, benchmarks); PyTorch is imported
only when one is built and is never a dependency of this package."""

from __future__ import annotations

from typing import Any


def torch_resnet18(num_classes: int = 10) -> Any:
    """The CIFAR ResNet-18 of :func:`resnet18` in PyTorch, with torchvision's module names (torchvision not needed)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            cin = 64
            for i, cout in enumerate((64, 128, 256, 512)):
                blocks = [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
                cin = cout
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.relu(self.bn1(self.conv1(x)))
            for i in range(1, 5):
                x = getattr(self, f"layer{i}")(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet18()
