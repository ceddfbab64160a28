"""The plane algorithm (stride-1 depthwise on the planes as given): against
the float64 reference, with epilogues, packed, and chosen by the model."""

import dataclasses

import numpy as np
import pytest
from conftest import (
    AVX512_CORE,
    check_cheapest_family,
    check_every_epilogue,
    check_tap_plan,
    check_tap_round_trip,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.choices import Algorithm
from cso.analysis.planes import vectors_per_call
from cso.geometry import make_geometry


@st.composite
def plane_problems(draw):
    # Planes narrower and wider than a vector, channel multipliers 1-3, and
    # any vertical padding; the horizontal padding adds up to (S-1)*dw.
    channels = draw(st.integers(2, 20))
    multiplier = draw(st.integers(1, 3))
    R, S = draw(st.sampled_from([1, 2, 3, 5, 7])), draw(st.sampled_from([1, 3, 5]))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    left = draw(st.integers(0, (S - 1) * dw))
    top, bottom = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    H, W = draw(st.integers(1, 20)), draw(st.integers(1, 40))
    batch = draw(st.integers(1, 2))
    params = dict(
        padding=((top, bottom), (left, (S - 1) * dw - left)), dilation=(dh, dw), groups=channels
    )
    x_shape, w_shape = (batch, channels, H, W), (channels * multiplier, 1, R, S)
    try:
        make_geometry(x_shape, w_shape, **params)
    except ValueError:
        assume(False)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threads = draw(st.sampled_from([1, min(2, cso.executor.available_threads())]))
    return x_shape, w_shape, params, dtype, threads, draw(st.booleans())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plane_problems(), st.integers(0, 2**32 - 1))
def test_planes_match_the_reference(problem, seed):
    check_tap_plan(problem, seed, "depthwise_planes")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_activation_and_residual_in_the_planes(dtype):
    check_every_epilogue(
        (2, 6, 13, 21), (12, 1, 3, 5), dict(padding=((2, 0), (1, 3)), groups=6), dtype,
        "depthwise_planes", 11,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_planes_with_packed_filters_round_trip(rng, tmp_path, dtype):
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 20, 9, 10), (40, 1, 5, 5),
        dict(padding=2, groups=20), "depthwise_planes",
    )  # fmt: skip


def test_the_model_weighs_the_plane_plan():
    # The rule, not this machine's outcome: the cheapest family that runs the layer.
    for x_shape, w_shape, params in (
        ((1, 32, 112, 112), (32, 1, 3, 3), dict(padding=1, groups=32)),
        ((1, 144, 56, 56), (144, 1, 3, 3), dict(padding=1, groups=144)),
        ((1, 1152, 7, 7), (1152, 1, 5, 5), dict(padding=2, groups=1152)),
    ):
        families = ("dense", "depthwise", "depthwise_lanes", "depthwise_planes", "depthwise_rows")
        check_cheapest_family(x_shape, w_shape, params, families)


def test_the_plane_plan_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="algorithm='depthwise_planes' needs one input channel"):
        cso.plan_conv2d(
            (1, 8, 9, 9), (8, 1, 3, 3), stride=2, groups=8, algorithm="depthwise_planes"
        )
    with pytest.raises(ValueError, match="needs one input channel"):
        # Q = W - 2: the output is narrower than the input.
        cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, algorithm="depthwise_planes")
    with pytest.raises(ValueError, match="a plane plan needs a depthwise layer"):
        dense = cso.plan_conv2d((1, 8, 9, 9), (8, 8, 3, 3), padding=1, algorithm="dense")
        # The plane plan's calls of this machine's vectors, one window part.
        registers = dense.hardware.vector_registers
        per_call = vectors_per_call(dense.geometry, dense.vector_lanes, registers)
        per_call *= dense.vector_lanes
        dataclasses.replace(
            dense, algorithm=Algorithm.DEPTHWISE_PLANES, filters_per_tile=1,
            windows_per_tile=per_call, window_parts=1,
        )  # fmt: skip
    planes = cso.plan_conv2d(
        (1, 8, 9, 9), (8, 1, 3, 3), padding=1, groups=8, algorithm="depthwise_planes"
    )
    with pytest.raises(ValueError, match="a plane plan computes 1 x"):
        dataclasses.replace(planes, windows_per_tile=planes.windows_per_tile + 1)


def test_explain_tells_the_planes_story():
    plan = cso.plan_conv2d(
        (1, 32, 20, 20), (32, 1, 3, 3), padding=1, groups=32, algorithm="depthwise_planes",
        hardware=AVX512_CORE,
    )  # fmt: skip
    text = cso.explain(plan)
    assert "Algorithm: depthwise on the planes as given" in text
    # 400 pixels: 25 vectors of 16 and 225 taps, one call a plane; vectors 0
    # and 24 hold only the first and last rows' pixels: 3 taps off the plane each.
    assert "built for 20x20 planes: all 25 output vector(s) of 16 pixels" in text
    assert "219 of 225 (vector, tap) pairs on the plane" in text
    assert "depthwise plan" in text and "depthwise_lanes plan" in text and "dense plan" in text
    # 56x56 planes are too large for one call: 196 vectors in calls of 4.
    wide = cso.plan_conv2d(
        (1, 32, 56, 56), (32, 1, 3, 3), padding=1, groups=32, algorithm="depthwise_planes",
        hardware=AVX512_CORE,
    )  # fmt: skip
    assert "196 output vector(s) a plane in 49 call(s)" in cso.explain(wide)


def test_the_plane_launch_puts_its_masks_on_cache_lines():
    plan = cso.plan_conv2d((1, 8, 14, 14), (8, 1, 3, 3), padding=1, groups=8,
                           algorithm="depthwise_planes")  # fmt: skip
    offsets = cso.launch.launch_for(plan, False).offsets
    assert offsets.ctypes.data % 64 == 0
    assert offsets[3] % 16 == 0  # the whole-plane call's masks, in int32 elements
