"""The bench's layer lists against the architectures' published sizes."""

import pytest

from cso.models import MODELS


@pytest.mark.parametrize(
    "name, layers, depthwise, giga_macs",
    [
        # Convolutions only (the classifier's Linear is not one); multiply-adds
        # as torchvision and the papers count them, less the classifier's.
        ("resnet50", 53, 0, 4.09),
        ("mobilenetv2_100", 52, 17, 0.30),
        ("efficientnet_b0", 81, 16, 0.385),
        ("resnext50", 53, 0, 4.23),
    ],
)
def test_layer_counts_and_multiply_adds(name, layers, depthwise, giga_macs):
    model = MODELS[name]()
    assert sum(layer.count for layer in model) == layers
    assert sum(layer.count for layer in model if layer.depthwise) == depthwise
    macs = sum(layer.flops * layer.count for layer in model) / 2e9
    assert macs == pytest.approx(giga_macs, rel=0.03)


def test_grouped_layers_carry_their_groups():
    grouped = [layer for layer in MODELS["resnext50"]() if layer.groups > 1]
    assert len(grouped) == 7 and sum(layer.count for layer in grouped) == 16
    for layer in grouped:
        assert layer.groups == 32 and layer.w_shape[1] * 32 == layer.x_shape[1]
        assert layer.params["groups"] == 32
