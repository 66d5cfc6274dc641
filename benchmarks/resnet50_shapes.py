"""The ResNet-50 gradient set the benchmarks reduce: the parameter shapes of
torchvision's resnet50(), in order (161 tensors, 25.6 M parameters), without
torchvision. Shared by allreduce_bench.py (CPU) and gpu_bench.py."""

import math


def resnet50_param_shapes():
    """Shapes of torchvision resnet50().parameters(), in order (161 tensors).

    conv1 7x7 3->64 + bn1; four stages of bottleneck blocks [3, 4, 6, 3] with
    widths 64, 128, 256, 512 and expansion 4 (1x1 reduce, 3x3, 1x1 expand,
    each followed by bn); the first block of each stage has a downsample
    1x1 conv + bn; fc 2048->1000 with bias. Convs have no bias.
    """
    shapes = []

    def conv(cin, cout, k):
        shapes.append((cout, cin, k, k))

    def bn(c):
        shapes.extend([(c,), (c,)])  # weight, bias

    conv(3, 64, 7)
    bn(64)
    inplanes = 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        for b in range(blocks):
            conv(inplanes, width, 1)
            bn(width)
            conv(width, width, 3)
            bn(width)
            conv(width, width * 4, 1)
            bn(width * 4)
            if b == 0:
                conv(inplanes, width * 4, 1)
                bn(width * 4)
            inplanes = width * 4
    shapes.append((1000, 2048))
    shapes.append((1000,))
    return shapes


RESNET50_SHAPES = resnet50_param_shapes()
RESNET50_NUMEL = sum(math.prod(s) for s in RESNET50_SHAPES)
assert len(RESNET50_SHAPES) == 161, len(RESNET50_SHAPES)
assert RESNET50_NUMEL == 25_557_032, RESNET50_NUMEL
