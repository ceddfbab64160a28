"""Convolution layers of reference models, as (name, x_shape, w_shape, params, count).

``count`` is how many times the layer's shape occurs in the model; totals
weight each distinct shape by it.  Shapes are for 224 x 224 inputs.
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

    def with_batch(self, batch: int) -> "Layer":
        return self._replace(x_shape=(batch,) + tuple(self.x_shape[1:]))

    @property
    def flops(self) -> int:
        from .geometry import make_geometry

        return make_geometry(
            self.x_shape, self.w_shape, stride=self.stride, padding=self.padding
        ).flops


def _conv(name, c, k, size, kernel, stride=1, padding=None, count=1):
    padding = kernel // 2 if padding is None else padding
    return Layer(name, (1, c, size, size), (k, c, kernel, kernel), stride, padding, count)


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


MODELS = {"resnet50": resnet50, "vgg16": vgg16}
