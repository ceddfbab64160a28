"""The depthwise algorithm: against the float64 reference, packed, tuned, chosen by the model."""

import dataclasses

import numpy as np
import pytest
from conftest import (
    AVX512_CORE,
    assert_matches_reference,
    check_cheapest_family,
    check_tap_plan,
    check_tap_round_trip,
    tap_filter_params,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.planes import is_plane_depthwise
from cso.analysis.rows import is_row_depthwise
from cso.geometry import make_geometry


@st.composite
def depthwise_problems(draw):
    channels = draw(st.integers(2, 9))
    multiplier = draw(st.integers(1, 3))
    R, S, stride, dilation, padding = draw(tap_filter_params())
    H, W = draw(st.integers(1, 20)), draw(st.integers(1, 70))
    batch = draw(st.integers(1, 3))
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=channels)
    w_shape = (channels * multiplier, 1, R, S)
    try:
        make_geometry((batch, channels, H, W), w_shape, **params)
    except ValueError:
        assume(False)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threads = draw(st.sampled_from([1, min(2, cso.executor.available_threads())]))
    bias = draw(st.booleans())
    return (batch, channels, H, W), w_shape, params, dtype, threads, bias


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depthwise_problems(), st.integers(0, 2**32 - 1))
def test_depthwise_matches_the_reference(problem, seed):
    x, w, b, plan = check_tap_plan(problem, seed, "depthwise")
    params = problem[2]
    if plan.geometry.out_width >= 2 * plan.vector_lanes:
        # Segments that overlap at the end of each row.
        other = dataclasses.replace(plan, windows_per_tile=2 * plan.vector_lanes, rows_per_call=1)
        assert_matches_reference(cso.conv2d(x, w, b, plan=other, **params), x, w, b, **params)


def test_the_model_chooses_the_cheaper_algorithm():
    # The rule, not this machine's outcome: the plan is the cheaper family.
    for x_shape, w_shape, params in (
        ((1, 144, 56, 56), (144, 1, 3, 3), dict(padding=1, groups=144)),
        ((1, 672, 14, 14), (672, 1, 5, 5), dict(stride=2, padding=2, groups=672)),
        ((1, 4, 3, 3), (8, 1, 1, 1), dict(groups=4)),
    ):
        # The lane plan too where it applies (channel multiplier 1), and the
        # plane and row plans where they run.
        families = ["dense", "depthwise"] + (
            ["depthwise_lanes"] if w_shape[0] == x_shape[1] else []
        )
        geometry = make_geometry(x_shape, w_shape, **params)
        if is_plane_depthwise(geometry):
            families.append("depthwise_planes")
        if is_row_depthwise(geometry):
            families.append("depthwise_rows")
        check_cheapest_family(x_shape, w_shape, params, families)
    # A dense setting forced plans densely; a dense layer is never depthwise.
    forced = cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, schedule="WS")
    assert forced.algorithm == "dense"
    with pytest.raises(ValueError, match="algorithm='depthwise' needs one input channel"):
        cso.plan_conv2d((1, 8, 9, 9), (8, 4, 3, 3), groups=2, algorithm="depthwise")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, algorithm="sparse")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_with_packed_filters_round_trip(rng, tmp_path, dtype):
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 12, 15, 17), (24, 1, 3, 3),
        dict(stride=2, padding=1, groups=12), "depthwise",
    )  # fmt: skip


def test_tuner_times_the_depthwise_plan_against_dense_ones(rng):
    x_shape, w_shape = (1, 16, 12, 12), (16, 1, 3, 3)
    result = cso.tune(x_shape, w_shape, padding=1, groups=16, threads=1, budget_s=0.5)
    timed = [c for c in result.candidates if c.seconds is not None]
    assert timed[0].origin == "analysis"
    # Both depthwise families (tap and lane) and dense plans are candidates.
    algorithms = {c.plan.algorithm for c in result.candidates}
    assert {"depthwise", "depthwise_lanes", "dense"} <= algorithms
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    y = cso.conv2d(x, w, padding=1, groups=16, plan=result.best)
    assert_matches_reference(y, x, w, padding=1, groups=16)


def test_row_blocks_only_where_offered():
    x_shape, w_shape = (1, 8, 28, 28), (8, 1, 3, 3)
    plan = cso.plan_conv2d(
        x_shape, w_shape, padding=1, groups=8, algorithm="depthwise", hardware=AVX512_CORE
    )
    # A 3x3 layer holds a block of rows: each load feeds up to R of them.
    assert plan.rows_per_call > 1
    text = cso.explain(plan)
    assert f"{plan.rows_per_call} output row(s)" in text and "each load feeds" in text
    dilated = cso.plan_conv2d(
        (1, 8, 28, 28), (8, 1, 3, 3), padding=2, dilation=2, groups=8, algorithm="depthwise"
    )
    assert dilated.rows_per_call == 1
    with pytest.raises(ValueError, match="rows_per_call=4 needs a row plan, or a tap plan"):
        dataclasses.replace(dilated, rows_per_call=4)
    with pytest.raises(ValueError, match="exceeds the registers"):
        dataclasses.replace(plan, rows_per_call=20)
    with pytest.raises(ValueError, match="exceeds the output's 28 rows"):
        dataclasses.replace(plan, rows_per_call=30)
    assert "one load per FMA" in cso.explain(dilated)


def test_explain_tells_the_depthwise_story():
    plan = cso.plan_conv2d(
        (1, 32, 20, 20), (32, 1, 3, 3), padding=1, groups=32, algorithm="depthwise"
    )
    text = cso.explain(plan)
    assert "Algorithm: depthwise" in text and "tap kernel" in text
    assert "best dense plan" in text and "FLOP per byte" in text
    # A block of rows says what bounds it: 5x5 keeps 12 rows' live vectors in
    # 32 registers, so 28 rows split into blocks of 10.
    block = cso.plan_conv2d(
        (1, 32, 28, 28), (32, 1, 5, 5), padding=2, groups=32, algorithm="depthwise",
        hardware=AVX512_CORE,
    )
    assert block.rows_per_call == 10
    text = cso.explain(block)
    assert "split evenly into blocks of at most 12" in text
    assert "(accumulators, weights, input rows feeding two FMAs or more; 27 here)" in text


def test_dense_loop_nest_variants_are_refused_for_depthwise_plans(rng):
    from cso import measure

    plan = cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, algorithm="depthwise")
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="those of a depthwise plan's loop nest"):
        measure.plan_program(plan, x, w, variant="outlined")
