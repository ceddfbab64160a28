"""The grouped algorithm (the tap kernel over a few channels a group):
against the float64 reference, packed, and chosen by the model."""

import dataclasses

import numpy as np
import pytest
from conftest import AVX512_CORE, check_tap_plan, check_tap_round_trip, tap_filter_params
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.choices import Algorithm
from cso.geometry import make_geometry


@st.composite
def grouped_problems(draw):
    groups = draw(st.integers(2, 5))
    group_channels = draw(st.integers(2, 6))
    multiplier = draw(st.integers(1, 3))
    R, S, stride, dilation, padding = draw(tap_filter_params())
    H, W = draw(st.integers(1, 20)), draw(st.integers(1, 40))
    batch = draw(st.integers(1, 2))
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    x_shape = (batch, groups * group_channels, H, W)
    w_shape = (groups * multiplier, group_channels, R, S)
    try:
        make_geometry(x_shape, w_shape, **params)
    except ValueError:
        assume(False)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threads = draw(st.sampled_from([1, min(2, cso.executor.available_threads())]))
    bias = draw(st.booleans())
    return x_shape, w_shape, params, dtype, threads, bias


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped_problems(), st.integers(0, 2**32 - 1))
def test_grouped_matches_the_reference(problem, seed):
    # The one-row kernel's columns run over every (row, channel, column) tap.
    check_tap_plan(problem, seed, "grouped")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_with_packed_filters_round_trip(rng, tmp_path, dtype):
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 24, 15, 17), (16, 6, 3, 3), dict(padding=1, groups=4), "grouped"
    )


def test_the_model_weighs_grouped_at_stride_one_only():
    # The rule, not this machine's outcome: at stride 1 the cheaper family,
    # at stride 2 dense (measured slower there than the model priced it).
    for x_shape, w_shape, params in (
        ((1, 128, 56, 56), (128, 4, 3, 3), dict(padding=1, groups=32)),
        ((1, 1024, 7, 7), (1024, 32, 3, 3), dict(padding=1, groups=32)),
        ((1, 256, 28, 28), (256, 8, 3, 3), dict(padding=1, groups=32)),
    ):
        chosen = cso.plan_conv2d(x_shape, w_shape, hardware=AVX512_CORE, **params)
        grouped = cso.plan_conv2d(
            x_shape, w_shape, hardware=AVX512_CORE, algorithm="grouped", **params
        )
        dense = cso.plan_conv2d(x_shape, w_shape, hardware=AVX512_CORE, algorithm="dense", **params)
        cheaper = (
            "grouped"
            if grouped.cost_of(grouped.schedule).cost < dense.cost_of(dense.schedule).cost
            else "dense"
        )
        assert chosen.algorithm == cheaper
    strided = dict(stride=2, padding=1, groups=32)
    assert cso.plan_conv2d((1, 256, 56, 56), (256, 8, 3, 3), **strided).algorithm == "dense"
    assert (
        cso.plan_conv2d((1, 256, 56, 56), (256, 8, 3, 3), algorithm="grouped", **strided).algorithm
        == "grouped"
    )
    with pytest.raises(ValueError, match="algorithm='grouped' needs more than one group of 2"):
        cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, algorithm="grouped")
    with pytest.raises(ValueError, match="algorithm='grouped' needs more than one group of 2"):
        cso.plan_conv2d((1, 256, 9, 9), (8, 128, 3, 3), groups=2, algorithm="grouped")
    with pytest.raises(ValueError, match="a grouped plan needs"):
        dense = cso.plan_conv2d((1, 8, 9, 9), (8, 8, 3, 3), algorithm="dense")
        dataclasses.replace(dense, algorithm=Algorithm.GROUPED, filters_per_tile=1,
                            windows_per_tile=dense.vector_lanes)  # fmt: skip


def test_explain_tells_the_grouped_story():
    plan = cso.plan_conv2d(
        (1, 64, 20, 20), (64, 8, 3, 3), padding=1, groups=8, algorithm="grouped"
    )
    text = cso.explain(plan)
    assert "Algorithm: grouped" in text and "8 input and 8 output channels a group" in text
    assert "72 taps a filter" in text and "best dense plan" in text
