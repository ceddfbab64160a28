"""The grouped algorithm (the tap kernel over a few channels a group):
against the float64 reference, packed, and chosen by the model."""

import dataclasses

import numpy as np
import pytest
from conftest import (
    AVX512_CORE,
    activate,
    activation_bound,
    check_tap_plan,
    check_tap_round_trip,
    error_bound,
    tap_filter_params,
)
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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped_problems(), st.integers(0, 2**32 - 1))
def test_grouped_matches_the_reference(problem, seed):
    # The one-row kernel's columns run over every (row, channel, column) tap.
    check_tap_plan(problem, seed, "grouped")


@pytest.mark.parametrize(
    "x_shape, w_shape, params",
    [
        # 8 filters a group: F of 1, 2, 4 and 8, rows 1 or a block, 1-2 vectors.
        ((1, 32, 21, 40), (64, 4, 3, 3), dict(padding=1, groups=8)),
        # Stride 2: the phases; asymmetric padding.
        ((2, 24, 23, 37), (48, 3, 3, 3), dict(stride=2, padding=((1, 0), (2, 1)), groups=8)),
        # Rows narrower than a vector: the masked last rows, per filter.
        ((1, 16, 7, 7), (32, 2, 3, 3), dict(padding=1, groups=8)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_filter_block_matches_the_reference(rng, x_shape, w_shape, params, dtype):
    # Each (rows, segment, filters a call) the analysis weighs, forced, with a
    # bias and the fused epilogue (residual, then ReLU), at two threads: each
    # filter of a call writes its own plane, with its own bias and residual.
    from cso.analysis import depthwise

    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, threads=2, algorithm="grouped", **params)
    residual = rng.standard_normal(plan.geometry.output_shape).astype(dtype)
    before = cso.reference.conv2d(x, w, b, **params) + residual
    bound = error_bound(x, w, b, dtype, **params) + np.finfo(dtype).eps * np.abs(residual)
    options = depthwise.kernel_options(
        plan.geometry, plan.vector_lanes, plan.hardware.vector_registers
    )
    # The F the registers allow (on AVX2's 16 registers not 8, on AVX-512's 32 all).
    assert {f for _, _, f in options} <= set(depthwise.filter_options(plan.geometry))
    assert max(f for _, _, f in options) > 1
    if dtype == np.float64:
        # The same kernels in wider elements: per F, its one-row kernel and
        # its first block of rows (and the last option, the widest segment)
        # keep every F's code; float32 runs them all.  Each option is a kernel
        # to compile: all of them in both dtypes made this test a tenth of
        # the suite's cold time.
        first_of = {}
        for option in options:
            first_of.setdefault((option[2], option[0] > 1), option)
        options = list(dict.fromkeys([*first_of.values(), options[-1]]))
    for rows, segment, filters in options:
        forced = dataclasses.replace(
            plan, rows_per_call=rows, windows_per_tile=segment, filters_per_tile=filters
        )
        y = cso.conv2d(x, w, b, plan=forced, activation="relu", residual=residual, **params)
        error = np.abs(y - activate("relu", before))
        assert np.all(error <= activation_bound(before, bound, dtype)), (rows, segment, filters)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_with_packed_filters_round_trip(rng, tmp_path, dtype):
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 24, 15, 17), (16, 6, 3, 3), dict(padding=1, groups=4), "grouped"
    )


def test_the_model_weighs_grouped_at_every_stride():
    # The rule, not this machine's outcome: the cheaper family in the model,
    # at stride 1 and 2 (with several filters a call the strided tap plans
    # load each input vector once for all of them).  With these weights each
    # stride has a layer of each family.
    chosen_by_stride = set()
    for x_shape, w_shape, params in (
        ((1, 128, 56, 56), (128, 4, 3, 3), dict(padding=1, groups=32)),
        ((1, 1024, 7, 7), (1024, 32, 3, 3), dict(padding=1, groups=32)),
        ((1, 256, 28, 28), (256, 8, 3, 3), dict(padding=1, groups=32)),
        ((1, 256, 56, 56), (256, 8, 3, 3), dict(stride=2, padding=1, groups=32)),
        ((1, 1024, 14, 14), (1024, 32, 3, 3), dict(stride=2, padding=1, groups=32)),
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
        chosen_by_stride.add((params.get("stride", 1), cheaper))
    assert chosen_by_stride == {(s, a) for s in (1, 2) for a in ("grouped", "dense")}
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
    four = dataclasses.replace(plan, filters_per_tile=4, rows_per_call=1)
    text = cso.explain(four)
    assert "4 filters a call: each input vector loaded once feeds all of them" in text
    assert "8 output channel(s), 4 at a time" in text and "y[k0:k0+4, p0:p0+1" in text
