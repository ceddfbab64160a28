"""The lane algorithm (depthwise, channels in the vector lanes): against the
float64 reference, with epilogues, packed, and chosen by the model."""

import dataclasses

import numpy as np
import pytest
from conftest import (
    AVX512_CORE,
    assert_matches_reference,
    check_cheapest_family,
    check_every_epilogue,
    check_tap_plan,
    check_tap_round_trip,
    tap_filter_params,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.choices import Algorithm
from cso.analysis.planes import is_plane_depthwise
from cso.analysis.rows import is_row_depthwise
from cso.geometry import make_geometry


@st.composite
def lane_problems(draw):
    # Channel counts on both sides of whole blocks of 8 and 16 lanes.
    channels = draw(st.integers(1, 40))
    R, S, stride, dilation, padding = draw(tap_filter_params())
    H, W = draw(st.integers(1, 20)), draw(st.integers(1, 30))
    batch = draw(st.integers(1, 2))
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=channels)
    x_shape, w_shape = (batch, channels, H, W), (channels, 1, R, S)
    try:
        make_geometry(x_shape, w_shape, **params)
    except ValueError:
        assume(False)
    assume(channels > 1)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threads = draw(st.sampled_from([1, min(2, cso.executor.available_threads())]))
    return x_shape, w_shape, params, dtype, threads, draw(st.booleans())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lane_problems(), st.integers(0, 2**32 - 1), st.integers(1, 4))
def test_lanes_match_the_reference(problem, seed, shorter):
    x, w, b, plan = check_tap_plan(problem, seed, "depthwise_lanes")
    params = problem[2]
    # Shorter runs of pixels, whose last one overlaps the one before.
    other = dataclasses.replace(plan, windows_per_tile=max(1, plan.windows_per_tile // shorter))
    assert_matches_reference(cso.conv2d(x, w, b, plan=other, **params), x, w, b, **params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_activation_and_residual_in_the_lanes(dtype):
    check_every_epilogue(
        (2, 21, 9, 11), (21, 1, 3, 5), dict(padding=(1, 2), groups=21), dtype,
        "depthwise_lanes", 7,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lanes_with_packed_filters_round_trip(rng, tmp_path, dtype):
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 20, 9, 10), (20, 1, 5, 5),
        dict(stride=2, padding=2, groups=20), "depthwise_lanes",
    )  # fmt: skip


def test_the_model_chooses_the_cheapest_family():
    # The rule, not this machine's outcome: of dense, the tap plan, the lane
    # plan and, where it runs the layer, the plane plan, the cheapest.
    for x_shape, w_shape, params in (
        ((1, 144, 56, 56), (144, 1, 3, 3), dict(padding=1, groups=144)),
        ((1, 672, 14, 14), (672, 1, 5, 5), dict(stride=2, padding=2, groups=672)),
        ((1, 1152, 7, 7), (1152, 1, 5, 5), dict(padding=2, groups=1152)),
    ):
        families = ["dense", "depthwise", "depthwise_lanes"]
        geometry = make_geometry(x_shape, w_shape, **params)
        if is_plane_depthwise(geometry):
            families.append("depthwise_planes")
        if is_row_depthwise(geometry):
            families.append("depthwise_rows")
        check_cheapest_family(x_shape, w_shape, params, families)
    # A channel multiplier above 1 is not the lane plan's.
    multiplied = cso.plan_conv2d((1, 8, 9, 9), (16, 1, 3, 3), groups=8)
    assert multiplied.algorithm != "depthwise_lanes"
    with pytest.raises(ValueError, match="algorithm='depthwise_lanes' needs one input channel"):
        cso.plan_conv2d((1, 8, 9, 9), (16, 1, 3, 3), groups=8, algorithm="depthwise_lanes")
    with pytest.raises(ValueError, match="a lane plan needs a depthwise layer"):
        dense = cso.plan_conv2d((1, 8, 9, 9), (8, 8, 3, 3), algorithm="dense")
        dataclasses.replace(dense, algorithm=Algorithm.DEPTHWISE_LANES, filters_per_tile=1,
                            windows_per_tile=3)  # fmt: skip
    lanes = cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, algorithm="depthwise_lanes")
    with pytest.raises(ValueError, match="a lane plan computes 1 x"):
        dataclasses.replace(lanes, windows_per_tile=10)


def test_explain_tells_the_lanes_story():
    plan = cso.plan_conv2d(
        (1, 40, 7, 7), (40, 1, 5, 5), padding=2, groups=40, algorithm="depthwise_lanes",
        hardware=AVX512_CORE,
    )  # fmt: skip
    text = cso.explain(plan)
    assert "Algorithm: depthwise, channels in the vector lanes" in text
    assert "3 block(s) of 16 channels, the last with 8" in text
    assert "depthwise plan" in text and "dense plan" in text
