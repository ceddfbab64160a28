"""Fused epilogues: conv2d(..., activation=..., residual=...) against the float64 reference."""

import numpy as np
import pytest
from conftest import activate, activation_bound, error_bound
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.choices import ACTIVATIONS

NAMES = [member.value for member in ACTIVATIONS]

# (x shape, w shape, parameters): a dense layer with full and edge tiles, a
# 1x1 layer of few windows (filter-vectorised when packed), a depthwise layer
# (rows in registers), a strided depthwise one, and a grouped one.
LAYERS = [
    ((1, 32, 10, 9), (24, 32, 3, 3), dict(padding=1)),
    ((2, 40, 7, 7), (48, 40, 1, 1), {}),
    ((1, 24, 12, 12), (24, 1, 3, 3), dict(padding=1, groups=24)),
    ((1, 16, 11, 11), (32, 1, 5, 5), dict(padding=2, stride=2, groups=16)),
    ((1, 12, 9, 8), (12, 3, 3, 3), dict(padding=(1, 2), groups=4)),
]


def expected_and_bound(x, w, bias, residual, activation, dtype, **params):
    exact = cso.reference.conv2d(
        x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), **params
    )
    bound = error_bound(x, w, bias, dtype, **params)
    if residual is not None:
        exact = exact + residual.astype(np.float64)
        bound = bound + np.finfo(dtype).eps * np.abs(residual)
    return activate(activation, exact), activation_bound(exact, bound, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_every_activation_with_and_without_residual(layer, dtype):
    x_shape, w_shape, params = LAYERS[layer]
    rng = np.random.default_rng(layer)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    bias = rng.standard_normal(w_shape[0]).astype(dtype)
    output_shape = cso.plan_conv2d(x_shape, w_shape, **params).geometry.output_shape
    residual = rng.standard_normal(output_shape).astype(dtype) * 3
    packed = cso.pack_filters(w, x_shape, bias=bias, **params)
    for activation in [None] + NAMES:
        for res in (None, residual):
            expected, bound = expected_and_bound(x, w, bias, res, activation, dtype, **params)
            y = cso.conv2d(x, w, bias, activation=activation, residual=res, **params)
            assert y.dtype == dtype
            assert np.all(np.abs(y - expected) <= bound), (activation, res is not None)
            y = cso.conv2d(x, packed, activation=activation, residual=res)
            assert np.all(np.abs(y - expected) <= bound), ("packed", activation)


def test_residual_may_be_out():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32, 10, 9)).astype(np.float32)
    w = rng.standard_normal((24, 32, 3, 3)).astype(np.float32)
    bias = np.zeros(24, np.float32)
    y = rng.standard_normal((1, 24, 10, 9)).astype(np.float32)
    expected, bound = expected_and_bound(x, w, bias, y.copy(), "relu", np.float32, padding=1)
    result = cso.conv2d(x, w, padding=1, activation="relu", residual=y, out=y)
    assert result is y
    assert np.all(np.abs(y - expected) <= bound)


def test_residual_is_cast_to_the_result_dtype():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((16, 8, 1, 1)).astype(np.float32)
    residual = rng.standard_normal((1, 16, 6, 6))  # float64, read as float32
    y = cso.conv2d(x, w, residual=residual, activation="silu")
    assert y.dtype == np.float32
    expected, bound = expected_and_bound(
        x, w, np.zeros(16, np.float32), residual.astype(np.float32), "silu", np.float32
    )
    assert np.all(np.abs(y - expected) <= bound)


def test_nan_and_extremes_pass_through_activations():
    x = np.array([np.nan, -1e30, 1e30, -100.0, 100.0, 0.0, -3.0, 3.0], np.float32)
    x = x.reshape(1, 1, 1, 8)
    w = np.ones((1, 1, 1, 1), np.float32)
    for activation in NAMES:
        y = cso.conv2d(x, w, activation=activation).reshape(-1)
        expected = activate(activation, x.reshape(-1))
        assert np.isnan(y[0])
        # The float32 arithmetic's own error only (the convolution is exact here).
        bound = activation_bound(x.reshape(-1)[1:].astype(np.float64), 0.0, np.float32)
        assert np.all(np.abs(y[1:] - expected[1:]) <= bound), activation


def test_bad_activation_and_residual_are_refused():
    x = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((3, 2, 1, 1), np.float32)
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'relu6'.*'gelu'"):
        cso.conv2d(x, w, activation="tanh")
    with pytest.raises(ValueError, match="activation"):
        cso.conv2d(x, w, activation=1)
    with pytest.raises(ValueError, match=r"residual must have the output's shape \(1, 3, 4, 4\)"):
        cso.conv2d(x, w, residual=np.ones((1, 3, 4, 5), np.float32))
    with pytest.raises(TypeError, match="residual must have a real numeric dtype"):
        cso.conv2d(x, w, residual=np.ones((1, 3, 4, 4), complex))
    packed = cso.pack_filters(w, x.shape)
    with pytest.raises(ValueError, match="activation"):
        cso.conv2d(x, packed, activation="swish")
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        cso.conv2d(x, packed, residual=np.ones(3, np.float32))


@settings(max_examples=12, deadline=None)
@given(
    channels=st.integers(1, 9),
    multiplier=st.integers(1, 2),
    groups_kind=st.sampled_from(["depthwise", "grouped", "dense"]),
    kernel=st.sampled_from([1, 3, 5]),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    pads=st.tuples(*[st.integers(0, 2)] * 4),
    size=st.integers(6, 13),
    activation=st.sampled_from([None] + NAMES),
    with_residual=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_property_epilogue_matches_reference(
    channels, multiplier, groups_kind, kernel, stride, dilation, pads, size, activation,
    with_residual, threads,
):  # fmt: skip
    threads = min(threads, cso.detect_hardware().cores)
    groups = {"depthwise": channels, "grouped": 1 if channels < 2 else channels, "dense": 1}
    groups = groups[groups_kind]
    filters = channels * multiplier
    params = dict(
        stride=stride, dilation=dilation, padding=((pads[0], pads[1]), (pads[2], pads[3])),
        groups=groups,
    )  # fmt: skip
    # Both padded extents (the width is size + 1) must hold the dilated kernel.
    reach = dilation * (kernel - 1) + 1
    assume(size + pads[0] + pads[1] >= reach and size + 1 + pads[2] + pads[3] >= reach)
    rng = np.random.default_rng(channels * 100 + size)
    x = rng.standard_normal((1, channels, size, size + 1)).astype(np.float32)
    w = rng.standard_normal((filters, channels // groups, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(filters).astype(np.float32)
    output_shape = cso.plan_conv2d(x.shape, w.shape, **params).geometry.output_shape
    residual = rng.standard_normal(output_shape).astype(np.float32) if with_residual else None
    y = cso.conv2d(x, w, bias, activation=activation, residual=residual, threads=threads, **params)
    expected, bound = expected_and_bound(x, w, bias, residual, activation, np.float32, **params)
    assert np.all(np.abs(y - expected) <= bound)
