"""Models for the examples, in plain PyTorch (torchvision does not install beside the
CPU torch wheel used here).

* ``resnet50()`` / ``resnet18()``: the ImageNet ResNets (He et al. 2015, v1.5: the
  stride sits in the 3x3 convolution of a bottleneck), 3x224x224 inputs, 1000 classes,
  with torchvision's parameter names and counts (25.6 M and 11.7 M parameters).
* ``resnet_small()``: a narrow CIFAR-style ResNet (3x32x32 inputs) for CPU runs.
* ``mlp()``: a three-layer perceptron on flattened 1x28x28 inputs.
* ``mlp512()``: issue 19's deep narrow perceptron (22 layers of width 512), many
  mid-sized gradients for little compute.

``MODELS`` maps each name to (constructor, input shape, number of classes).
"""

import torch
import torch.nn as nn


def _conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = _conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A ResNet of `block`s in len(layers) stages of widths base, 2*base, 4*base, ...

    stem='imagenet': 7x7/2 convolution and 3x3/2 max-pool (224x224 inputs);
    stem='cifar': one 3x3 convolution (32x32 inputs).
    """

    def __init__(self, block, layers, num_classes=1000, base_width=64, stem="imagenet"):
        super().__init__()
        self.inplanes = base_width
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        else:
            self.conv1 = _conv3x3(3, base_width)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        for i, blocks in enumerate(layers):
            stages.append(self._make_layer(block, base_width * 2 ** i, blocks, stride=1 if i == 0 else 2))
        for i, stage in enumerate(stages):
            self.add_module("layer%d" % (i + 1), stage)
        self.num_stages = len(stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # Zero-init the last BN of each residual branch: every block starts as identity.
        for m in self.modules():
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)
            elif isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)

    def _make_layer(self, block, width, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != width * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, width * block.expansion, stride),
                                       nn.BatchNorm2d(width * block.expansion))
        layers = [block(self.inplanes, width, stride, downsample)]
        self.inplanes = width * block.expansion
        layers += [block(self.inplanes, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, "layer%d" % (i + 1))(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes=1000):
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


def resnet18(num_classes=1000):
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


def resnet_small(num_classes=10):
    """CIFAR-style ResNet-14 with widths 16/32/64 (about 0.17 M parameters)."""
    return ResNet(BasicBlock, [2, 2, 2], num_classes, base_width=16, stem="cifar")


def mlp(num_classes=10, hidden=1024):
    """784 -> 1024 -> 1024 -> 10 (about 1.9 M parameters): little compute per
    parameter, so its data-parallel speed leans on the gradient allreduce."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, num_classes))


def mlp512(num_classes=10, depth=21, width=512):
    """21 x (Linear(512, 512) + ReLU), then Linear(512, 10), on 512-wide inputs:
    44 parameter tensors (22 weights, 22 biases), 5,520,906 parameters, 22.1 MB of
    float32 gradients a step (21 x 1 MiB weights)."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


MODELS = {
    "resnet50": (resnet50, (3, 224, 224), 1000),
    "resnet18": (resnet18, (3, 224, 224), 1000),
    "resnet_small": (resnet_small, (3, 32, 32), 10),
    "mlp": (mlp, (1, 28, 28), 10),
    "mlp512": (mlp512, (512,), 10),
}
