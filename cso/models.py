"""Convolution layers of reference models, as (name, x_shape, w_shape, stride,
padding, count, groups).

``count`` is how many times the layer's shape occurs in the model; totals
weight each distinct shape by it.  Shapes are for 224 x 224 inputs, written
from the architectures as torchvision builds them (``groups`` > 1 for
grouped and depthwise layers: ``w_shape`` is then ``(K, C // groups, R, S)``).
"""

from __future__ import annotations

from typing import NamedTuple


class Layer(NamedTuple):
    name: str
    x_shape: tuple
    w_shape: tuple
    stride: int
    padding: int
    count: int
    groups: int = 1

    @property
    def params(self) -> dict:
        """``stride``, ``padding`` and ``groups`` as :func:`cso.conv2d` takes them."""
        return {"stride": self.stride, "padding": self.padding, "groups": self.groups}

    @property
    def depthwise(self) -> bool:
        """One input channel per group (``groups == C > 1``)."""
        return self.groups > 1 and self.w_shape[1] == 1

    def with_batch(self, batch: int) -> "Layer":
        return self._replace(x_shape=(batch,) + tuple(self.x_shape[1:]))

    @property
    def flops(self) -> int:
        from .geometry import make_geometry

        return make_geometry(self.x_shape, self.w_shape, **self.params).flops


def _conv(name, c, k, size, kernel, stride=1, padding=None, count=1, groups=1):
    padding = kernel // 2 if padding is None else padding
    return Layer(
        name, (1, c, size, size), (k, c // groups, kernel, kernel), stride, padding, count, groups
    )


def _depthwise(c, size, kernel, stride=1, count=1):
    name = f"dw {kernel}x{kernel}{'/2' if stride == 2 else ''} {c} @{size}"
    return _conv(name, c, c, size, kernel, stride, count=count, groups=c)


def _pointwise(c, k, size, count=1):
    return _conv(f"1x1 {c}->{k} @{size}", c, k, size, 1, count=count)


def resnet50() -> list:
    """ResNet-50 (torchvision v1.5: stride in the 3x3 convolution): 23 shapes, 53 layers."""
    return [
        _conv("conv1 7x7/2 3->64 @224", 3, 64, 224, 7, 2),
        _conv("l1 1x1 64->64 @56", 64, 64, 56, 1),
        _conv("l1 3x3 64 @56", 64, 64, 56, 3, count=3),
        _conv("l1 1x1 64->256 @56", 64, 256, 56, 1, count=4),
        _conv("l1 1x1 256->64 @56", 256, 64, 56, 1, count=2),
        _conv("l2 1x1 256->128 @56", 256, 128, 56, 1),
        _conv("l2 3x3/2 128 @56", 128, 128, 56, 3, 2),
        _conv("l2 1x1 128->512 @28", 128, 512, 28, 1, count=4),
        _conv("l2 1x1/2 256->512 @56", 256, 512, 56, 1, 2),
        _conv("l2 1x1 512->128 @28", 512, 128, 28, 1, count=3),
        _conv("l2 3x3 128 @28", 128, 128, 28, 3, count=3),
        _conv("l3 1x1 512->256 @28", 512, 256, 28, 1),
        _conv("l3 3x3/2 256 @28", 256, 256, 28, 3, 2),
        _conv("l3 1x1 256->1024 @14", 256, 1024, 14, 1, count=6),
        _conv("l3 1x1/2 512->1024 @28", 512, 1024, 28, 1, 2),
        _conv("l3 1x1 1024->256 @14", 1024, 256, 14, 1, count=5),
        _conv("l3 3x3 256 @14", 256, 256, 14, 3, count=5),
        _conv("l4 1x1 1024->512 @14", 1024, 512, 14, 1),
        _conv("l4 3x3/2 512 @14", 512, 512, 14, 3, 2),
        _conv("l4 1x1 512->2048 @7", 512, 2048, 7, 1, count=3),
        _conv("l4 1x1/2 1024->2048 @14", 1024, 2048, 14, 1, 2),
        _conv("l4 1x1 2048->512 @7", 2048, 512, 7, 1, count=2),
        _conv("l4 3x3 512 @7", 512, 512, 7, 3, count=2),
    ]


def vgg16() -> list:
    """VGG-16's 13 convolutions (all 3x3, padding 1) and its three fully
    connected layers written as convolutions (fc6: a 7x7 convolution of the
    7x7 feature map, 411 MB of float32 filters; fc7, fc8: 1x1 of a 1x1 map)."""
    return [
        _conv("3x3 3->64 @224", 3, 64, 224, 3),
        _conv("3x3 64 @224", 64, 64, 224, 3),
        _conv("3x3 64->128 @112", 64, 128, 112, 3),
        _conv("3x3 128 @112", 128, 128, 112, 3),
        _conv("3x3 128->256 @56", 128, 256, 56, 3),
        _conv("3x3 256 @56", 256, 256, 56, 3, count=2),
        _conv("3x3 256->512 @28", 256, 512, 28, 3),
        _conv("3x3 512 @28", 512, 512, 28, 3, count=2),
        _conv("3x3 512 @14", 512, 512, 14, 3, count=3),
        _conv("fc6 7x7 512->4096 @7", 512, 4096, 7, 7, padding=0),
        _conv("fc7 1x1 4096->4096 @1", 4096, 4096, 1, 1),
        _conv("fc8 1x1 4096->1000 @1", 4096, 1000, 1, 1),
    ]


def mobilenetv2_100() -> list:
    """MobileNetV2 (width 1.0, torchvision's ``mobilenet_v2``; timm's
    ``mobilenetv2_100``): 52 convolutions, 17 of them depthwise 3x3."""
    return [
        _conv("stem 3x3/2 3->32 @224", 3, 32, 224, 3, 2),
        _depthwise(32, 112, 3),
        _pointwise(32, 16, 112),
        _pointwise(16, 96, 112),
        _depthwise(96, 112, 3, 2),
        _pointwise(96, 24, 56),
        _pointwise(24, 144, 56, count=2),
        _depthwise(144, 56, 3),
        _pointwise(144, 24, 56),
        _depthwise(144, 56, 3, 2),
        _pointwise(144, 32, 28),
        _pointwise(32, 192, 28, count=3),
        _depthwise(192, 28, 3, count=2),
        _pointwise(192, 32, 28, count=2),
        _depthwise(192, 28, 3, 2),
        _pointwise(192, 64, 14),
        _pointwise(64, 384, 14, count=4),
        _depthwise(384, 14, 3, count=4),
        _pointwise(384, 64, 14, count=3),
        _pointwise(384, 96, 14),
        _pointwise(96, 576, 14, count=3),
        _depthwise(576, 14, 3, count=2),
        _pointwise(576, 96, 14, count=2),
        _depthwise(576, 14, 3, 2),
        _pointwise(576, 160, 7),
        _pointwise(160, 960, 7, count=3),
        _depthwise(960, 7, 3, count=3),
        _pointwise(960, 160, 7, count=2),
        _pointwise(960, 320, 7),
        _pointwise(320, 1280, 7),
    ]


def _squeeze_excite(c, squeezed, count=1):
    # The squeeze-and-excitation block's two 1x1 convolutions of the pooled 1x1 map.
    return [
        _conv(f"se 1x1 {c}->{squeezed} @1", c, squeezed, 1, 1, count=count),
        _conv(f"se 1x1 {squeezed}->{c} @1", squeezed, c, 1, 1, count=count),
    ]


def efficientnet_b0() -> list:
    """EfficientNet-B0 (torchvision's ``efficientnet_b0``): 81 convolutions,
    16 of them depthwise (3x3 and 5x5), 32 the squeeze-and-excitation blocks'."""
    return [
        _conv("stem 3x3/2 3->32 @224", 3, 32, 224, 3, 2),
        _depthwise(32, 112, 3),
        *_squeeze_excite(32, 8),
        _pointwise(32, 16, 112),
        _pointwise(16, 96, 112),
        _depthwise(96, 112, 3, 2),
        *_squeeze_excite(96, 4),
        _pointwise(96, 24, 56),
        _pointwise(24, 144, 56, count=2),
        _depthwise(144, 56, 3),
        *_squeeze_excite(144, 6, count=2),
        _pointwise(144, 24, 56),
        _depthwise(144, 56, 5, 2),
        _pointwise(144, 40, 28),
        _pointwise(40, 240, 28, count=2),
        _depthwise(240, 28, 5),
        *_squeeze_excite(240, 10, count=2),
        _pointwise(240, 40, 28),
        _depthwise(240, 28, 3, 2),
        _pointwise(240, 80, 14),
        _pointwise(80, 480, 14, count=3),
        _depthwise(480, 14, 3, count=2),
        *_squeeze_excite(480, 20, count=3),
        _pointwise(480, 80, 14, count=2),
        _depthwise(480, 14, 5),
        _pointwise(480, 112, 14),
        _pointwise(112, 672, 14, count=3),
        _depthwise(672, 14, 5, count=2),
        *_squeeze_excite(672, 28, count=3),
        _pointwise(672, 112, 14, count=2),
        _depthwise(672, 14, 5, 2),
        _pointwise(672, 192, 7),
        _pointwise(192, 1152, 7, count=4),
        _depthwise(1152, 7, 5, count=3),
        *_squeeze_excite(1152, 48, count=4),
        _pointwise(1152, 192, 7, count=3),
        _depthwise(1152, 7, 3),
        _pointwise(1152, 320, 7),
        _pointwise(320, 1280, 7),
    ]


def resnext50() -> list:
    """ResNeXt-50 32x4d (torchvision's ``resnext50_32x4d``): ResNet-50 with
    bottlenecks twice as wide and their 3x3 convolutions in 32 groups (4 to
    32 channels a group); 23 shapes, 53 layers."""

    def grouped(name, c, size, stride=1, count=1):
        return _conv(name, c, c, size, 3, stride, count=count, groups=32)

    return [
        _conv("conv1 7x7/2 3->64 @224", 3, 64, 224, 7, 2),
        _conv("l1 1x1 64->128 @56", 64, 128, 56, 1),
        grouped("l1 3x3 g32 128 @56", 128, 56, count=3),
        _conv("l1 1x1 128->256 @56", 128, 256, 56, 1, count=3),
        _conv("l1 1x1 64->256 @56", 64, 256, 56, 1),
        _conv("l1 1x1 256->128 @56", 256, 128, 56, 1, count=2),
        _conv("l2 1x1 256->256 @56", 256, 256, 56, 1),
        grouped("l2 3x3/2 g32 256 @56", 256, 56, 2),
        _conv("l2 1x1 256->512 @28", 256, 512, 28, 1, count=4),
        _conv("l2 1x1/2 256->512 @56", 256, 512, 56, 1, 2),
        _conv("l2 1x1 512->256 @28", 512, 256, 28, 1, count=3),
        grouped("l2 3x3 g32 256 @28", 256, 28, count=3),
        _conv("l3 1x1 512->512 @28", 512, 512, 28, 1),
        grouped("l3 3x3/2 g32 512 @28", 512, 28, 2),
        _conv("l3 1x1 512->1024 @14", 512, 1024, 14, 1, count=6),
        _conv("l3 1x1/2 512->1024 @28", 512, 1024, 28, 1, 2),
        _conv("l3 1x1 1024->512 @14", 1024, 512, 14, 1, count=5),
        grouped("l3 3x3 g32 512 @14", 512, 14, count=5),
        _conv("l4 1x1 1024->1024 @14", 1024, 1024, 14, 1),
        grouped("l4 3x3/2 g32 1024 @14", 1024, 14, 2),
        _conv("l4 1x1 1024->2048 @7", 1024, 2048, 7, 1, count=3),
        _conv("l4 1x1/2 1024->2048 @14", 1024, 2048, 14, 1, 2),
        _conv("l4 1x1 2048->1024 @7", 2048, 1024, 7, 1, count=2),
        grouped("l4 3x3 g32 1024 @7", 1024, 7, count=2),
    ]


MODELS = {
    "resnet50": resnet50,
    "vgg16": vgg16,
    "efficientnet_b0": efficientnet_b0,
    "mobilenetv2_100": mobilenetv2_100,
    "resnext50": resnext50,
}
