"""The row algorithm (depthwise on the planes as given, a block of output
rows at a time): against the float64 reference, every block against the
one-row kernel, with epilogues, packed, and chosen by the model."""

import dataclasses
import functools

import numpy as np
import pytest
from conftest import (
    AVX512_CORE,
    assert_matches_reference,
    check_cheapest_family,
    check_every_epilogue,
    check_tap_plan,
    check_tap_round_trip,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.choices import Algorithm, activation_code
from cso.analysis.plane_shapes import filters_per_vector, max_block_rows
from cso.analysis.rows import full_interior_vectors, row_traffic, with_filters_per_call
from cso.geometry import make_geometry
from cso.launch import launch_for, rows_module_for
from cso.microkernels.row_taps import build_row_tap_kernel
from cso.microkernels.vector_ir import target_has_mask_registers


@st.composite
def row_problems(draw, channels=(2, 12), multipliers=(1, 3), widths=(1, 80), heights=(1, 20),
                 kernel_widths=(1, 3, 5)):  # fmt: skip
    # Rows narrower and wider than a call, horizontal strides 1 and 2, any
    # vertical stride, dilation, padding and channel multiplier.
    channels = draw(st.integers(*channels))
    multiplier = draw(st.integers(*multipliers))
    R, S = draw(st.sampled_from([1, 2, 3, 5, 7])), draw(st.sampled_from(kernel_widths))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = draw(
        st.tuples(
            st.tuples(st.integers(0, 3), st.integers(0, 3)),
            st.tuples(st.integers(0, 3), st.integers(0, 3)),
        )
    )
    H, W = draw(st.integers(*heights)), draw(st.integers(*widths))
    batch = draw(st.integers(1, 2))
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=channels)
    x_shape, w_shape = (batch, channels, H, W), (channels * multiplier, 1, R, S)
    try:
        make_geometry(x_shape, w_shape, **params)
    except ValueError:
        assume(False)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threads = draw(st.sampled_from([1, min(2, cso.executor.available_threads())]))
    return x_shape, w_shape, params, dtype, threads, draw(st.booleans())


# Planes whose output rows fit two or more to a vector (filters side by
# side), one filter a channel, a last job of fewer filters.
narrow_row_problems = functools.partial(
    row_problems, channels=(2, 21), multipliers=(1, 1), widths=(1, 16), heights=(1, 16),
    kernel_widths=(1, 3, 5, 7),
)  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_problems(), st.integers(0, 2**32 - 1))
def test_rows_match_the_reference(problem, seed):
    check_tap_plan(problem, seed, "depthwise_rows")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_problems(), st.sampled_from([2, 5]), st.integers(0, 2**32 - 1))
def test_every_block_of_rows_matches_the_one_row_kernel_bit_for_bit(problem, rows, seed):
    # Each output sums its taps in the same order whatever the block: any
    # difference would be a wrong tap or row, not rounding.
    x, w, b, plan = check_tap_plan(problem, seed, "depthwise_rows")
    params = problem[2]
    most = max_block_rows(plan.geometry, plan.hardware.vector_registers, plan.vector_lanes)
    block = dataclasses.replace(plan, rows_per_call=min(rows, most))
    one_row = dataclasses.replace(plan, rows_per_call=1)
    y = cso.conv2d(x, w, b, plan=block, **params)
    assert np.array_equal(y, cso.conv2d(x, w, b, plan=one_row, **params))
    assert_matches_reference(y, x, w, b, **params)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(narrow_row_problems(), st.integers(0, 2**32 - 1))
def test_filters_side_by_side_match_one_filter_a_call_bit_for_bit(problem, seed):
    # Each lane sums its taps in the same order whether its filter shares
    # the vector or not: any difference would be a wrong filter, lane or row.
    x_shape, w_shape, params, dtype, threads, with_bias = problem
    plan = cso.plan_conv2d(
        x_shape, w_shape, dtype=dtype, threads=threads, algorithm="depthwise_rows", **params
    )
    side = filters_per_vector(plan.geometry, plan.vector_lanes)
    assume(side > 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if with_bias else None
    together = dataclasses.replace(plan, filters_per_tile=side)
    alone = dataclasses.replace(plan, filters_per_tile=1)
    y = cso.conv2d(x, w, b, plan=together, **params)
    assert np.array_equal(y, cso.conv2d(x, w, b, plan=alone, **params))
    assert_matches_reference(y, x, w, b, **params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride", [1, 2])
def test_filters_side_by_side_apply_every_epilogue(rng, dtype, stride):
    # 7 filters over 4-wide rows (4 a float32 vector, 2 a float64 one): the
    # last job holds fewer; each activation and the residual, lane by lane
    # as the one-filter plan applies them.
    x = rng.standard_normal((2, 7, 9, 4 * stride)).astype(dtype)
    w = rng.standard_normal((7, 1, 3, 3)).astype(dtype)
    b = rng.standard_normal(7).astype(dtype)
    params = dict(stride=stride, padding=1, groups=7)
    plan = cso.plan_conv2d(x.shape, w.shape, dtype=dtype, threads=1,
                           algorithm="depthwise_rows", **params)  # fmt: skip
    side = filters_per_vector(plan.geometry, plan.vector_lanes)
    assert side > 1
    residual = rng.standard_normal(plan.geometry.output_shape).astype(dtype)
    for activation in (None, "relu", "relu6", "sigmoid", "silu"):
        results = [
            cso.conv2d(x, w, b, plan=dataclasses.replace(plan, filters_per_tile=filters),
                       activation=activation, residual=residual, **params)  # fmt: skip
            for filters in (side, 1)
        ]
        assert np.array_equal(results[0], results[1]), activation


def test_the_model_weighs_filters_side_by_side():
    # The rule, not this machine's outcome: of one filter a call and the
    # filters that fit side by side, the row plan takes the one it prices lower.
    for x_shape, w_shape, params in (
        ((1, 1152, 7, 7), (1152, 1, 5, 5), dict(padding=2, groups=1152)),
        ((1, 960, 7, 7), (960, 1, 3, 3), dict(padding=1, groups=960)),
        ((1, 576, 14, 14), (576, 1, 3, 3), dict(stride=2, padding=1, groups=576)),
        ((1, 64, 28, 28), (64, 1, 3, 3), dict(padding=1, groups=64)),
    ):
        plan = cso.plan_conv2d(
            x_shape, w_shape, algorithm="depthwise_rows", hardware=AVX512_CORE, **params
        )
        side = filters_per_vector(plan.geometry, plan.vector_lanes)
        costs = {
            filters: row_traffic(plan.geometry, AVX512_CORE, 4, 1, plan.rows_per_call, filters).cost
            for filters in {1, side}
        }
        assert plan.filters_per_tile == min(costs, key=costs.get)
        assert (side > 1) == (plan.geometry.out_width <= 8)
    seven = cso.plan_conv2d((1, 8, 7, 7), (8, 1, 3, 3), padding=1, groups=8,
                            algorithm="depthwise_rows", hardware=AVX512_CORE)  # fmt: skip
    with pytest.raises(ValueError, match="or 2 filters' side by side, got filters_per_tile=3"):
        dataclasses.replace(seven, filters_per_tile=3)
    with pytest.raises(ValueError, match="filters side by side \\(2\\) need one vector a call"):
        build_row_tap_kernel(3, 3, 1, 1, 1, 1, 4, 2, "float32", 16, filters_per_vector=2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("epilogue", [{}, dict(activation="relu6", residual=True)])
def test_unmasked_inner_vectors_match_the_masked_kernel_bit_for_bit(rng, threads, epilogue):
    # 3x3 over 56 columns: one call of 4 vectors, the middle two inside the row.
    x = rng.standard_normal((2, 6, 11, 56)).astype(np.float32)
    w = rng.standard_normal((12, 1, 3, 3)).astype(np.float32)
    params = dict(padding=1, groups=6)
    threads = min(threads, cso.executor.available_threads())
    plan = cso.plan_conv2d(x.shape, w.shape, threads=threads, algorithm="depthwise_rows",
                           **params)  # fmt: skip
    g, vectors = plan.geometry, plan.windows_per_tile // plan.vector_lanes
    assert vectors == 4 and full_interior_vectors(g, plan.vector_lanes, vectors)
    # The shipped module but for its inner vectors: the same whole-load
    # kernel's tail (with 16 lanes the row's 56 outputs end 8 lanes into
    # the fourth vector).
    masked = rows_module_for(plan, unmasked_inner=False)
    filters = cso.executor.filter_operands(w, None, plan)
    residual = rng.standard_normal(g.output_shape).astype(np.float32)
    fused = cso.executor.Epilogue(
        activation_code(epilogue.get("activation")), residual if epilogue else None
    )
    outputs = []
    for launch in (launch_for(plan, False), launch_for(plan, False, module=masked)):
        y = np.empty(g.output_shape, np.float32)
        cso.executor.run(plan, x, filters, y, launch, fused)
        outputs.append(y)
    assert np.array_equal(outputs[0], outputs[1])
    expected = cso.reference.conv2d(x, w, **params) + (residual if epilogue else 0)
    if epilogue:
        expected = np.clip(expected, 0, 6)
    assert np.allclose(outputs[0], expected, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="unmasked_inner needs more than 2 vectors"):
        build_row_tap_kernel(3, 3, 1, 1, 1, 1, 4, 2, "float32", 16, True)


def test_a_row_plan_holds_no_more_rows_than_the_output_and_registers():
    # 6 output rows; then 20, of one vector a row: 32 registers hold 8 rows
    # (a quarter of them, as a call of 4 vectors a row would).
    for height, most in ((6, 6), (20, 8)):
        plan = cso.plan_conv2d(
            (1, 8, height, 14), (8, 1, 3, 3), padding=1, groups=8,
            algorithm="depthwise_rows", hardware=AVX512_CORE,
        )  # fmt: skip
        assert 1 <= plan.rows_per_call <= most
        message = rf"rows_per_call \({most + 1}\) of a row plan must be in \[1, {most}\]"
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(plan, rows_per_call=most + 1)
    with pytest.raises(ValueError, match="rows_per_call"):
        dataclasses.replace(plan, rows_per_call=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_activation_and_residual_in_the_rows(dtype):
    check_every_epilogue(
        (2, 6, 13, 41), (12, 1, 3, 5), dict(stride=2, padding=((2, 0), (1, 3)), groups=6),
        dtype, "depthwise_rows", 13,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_with_packed_filters_round_trip(rng, tmp_path, dtype):
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 20, 19, 40), (20, 1, 3, 3),
        dict(stride=2, padding=1, groups=20), "depthwise_rows",
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_of_filters_side_by_side_with_packed_filters_round_trip(rng, tmp_path, dtype):
    # 7x7 planes (2 filters a float32 vector, 8 lanes of float64 hold 1): the
    # packed bias stays each filter's own, whatever the filters a vector.
    check_tap_round_trip(
        rng, tmp_path, dtype, (2, 21, 7, 7), (21, 1, 5, 5), dict(padding=2, groups=21),
        "depthwise_rows",
    )  # fmt: skip
    plan = cso.plan_conv2d((2, 21, 7, 7), (21, 1, 5, 5), padding=2, groups=21,
                           algorithm="depthwise_rows", hardware=AVX512_CORE)  # fmt: skip
    assert plan.filters_per_tile == 2


def test_a_row_plan_remade_for_one_filter_a_call_is_priced_for_it():
    # What the calibration's row probe runs: the one-filter kernel, its
    # traffic the model's for one filter (per filter, as side by side).
    plan = cso.plan_conv2d((1, 512, 7, 7), (512, 1, 3, 3), padding=1, groups=512,
                           algorithm="depthwise_rows", hardware=AVX512_CORE)  # fmt: skip
    assert plan.filters_per_tile == 2
    alone = with_filters_per_call(plan, 1)
    expected = row_traffic(plan.geometry, AVX512_CORE, 4, plan.threads, plan.rows_per_call, 1)
    assert alone.filters_per_tile == 1 and alone.cost_of(alone.schedule) == expected
    assert alone.cost_of(alone.schedule).cost > plan.cost_of(plan.schedule).cost
    assert with_filters_per_call(alone, 2) == plan


def test_the_model_weighs_the_row_plan():
    # The rule, not this machine's outcome: the cheapest family that runs the layer.
    for x_shape, w_shape, params in (
        ((1, 96, 112, 112), (96, 1, 3, 3), dict(stride=2, padding=1, groups=96)),
        ((1, 240, 28, 28), (240, 1, 3, 3), dict(stride=2, padding=1, groups=240)),
        ((1, 672, 14, 14), (672, 1, 5, 5), dict(stride=2, padding=2, groups=672)),
    ):
        families = ("dense", "depthwise", "depthwise_lanes", "depthwise_rows")
        check_cheapest_family(x_shape, w_shape, params, families)


def test_the_row_plan_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="algorithm='depthwise_rows' needs one input channel"):
        cso.plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), stride=3, groups=8, algorithm="depthwise_rows")
    rows = cso.plan_conv2d(
        (1, 8, 9, 9), (8, 1, 3, 3), padding=1, groups=8, algorithm="depthwise_rows"
    )
    with pytest.raises(ValueError, match="a row plan needs a depthwise layer"):
        dense = cso.plan_conv2d((1, 8, 9, 9), (8, 8, 3, 3), padding=1, algorithm="dense")
        dataclasses.replace(
            dense, algorithm=Algorithm.DEPTHWISE_ROWS, filters_per_tile=1,
            windows_per_tile=rows.windows_per_tile,
        )  # fmt: skip
    with pytest.raises(ValueError, match="a row plan computes 1 x"):
        dataclasses.replace(rows, windows_per_tile=rows.windows_per_tile + 1)


def test_explain_tells_the_rows_story():
    plan = cso.plan_conv2d(
        (1, 32, 40, 150), (32, 1, 3, 3), stride=2, padding=1, groups=32,
        algorithm="depthwise_rows", hardware=AVX512_CORE,
    )  # fmt: skip
    text = cso.explain(plan)
    assert "Algorithm: depthwise on the planes as given, a block of output rows" in text
    # Q = 75: a whole row of 5 vectors of 16 a call (32 registers hold 4 rows
    # of up to 8), at q0 = 0.
    assert "1 call(s) a row at q0 = [0] (75 of 80 lanes used)" in text
    # 20 output rows, 5 vectors a row: blocks of at most 32 registers / 5 = 6
    # rows, spanning 6 input rows at stride 1; at stride 2, (B-1)*2 + 1: 5
    # for 3 rows, 7 for 4.  Split evenly down the plane: 7 blocks of 3.
    assert f"{plan.rows_per_call} output row(s) x 5 vector(s)" in text
    assert plan.rows_per_call in (1, 3)
    assert "depthwise plan" in text and "depthwise_lanes plan" in text and "dense plan" in text


@pytest.mark.skipif(
    not target_has_mask_registers(), reason="masked FMAs need AVX-512's mask registers"
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masked_fmas_match_the_anded_loads_bit_for_bit(rng, dtype):
    # 5x5 over 14 and 40 columns at stride 1, 3x3 and 5x5 at horizontal
    # stride 2 (whole-load and checked calls, tails, the padding on every
    # side): the shipped module, whose masked columns add under mask
    # registers, against the same module anding each loaded vector instead.
    for height, width, size, stride in ((14, 14, 5, 1), (9, 40, 5, 1), (9, 40, 3, 2),
                                        (12, 57, 5, (1, 2))):  # fmt: skip
        x = rng.standard_normal((2, 5, height, width)).astype(dtype)
        w = rng.standard_normal((10, 1, size, size)).astype(dtype)
        params = dict(stride=stride, padding=((2, 1), (2, 3)), groups=5)
        plan = cso.plan_conv2d(x.shape, w.shape, dtype=dtype, threads=1,
                               algorithm="depthwise_rows", **params)  # fmt: skip
        anded = rows_module_for(plan, masked_fmas=False)
        filters = cso.executor.filter_operands(w, None, plan)
        outputs = []
        for launch in (launch_for(plan, False), launch_for(plan, False, module=anded)):
            y = np.empty(plan.geometry.output_shape, dtype)
            cso.executor.run(plan, x, filters, y, launch, cso.executor.NO_EPILOGUE)
            outputs.append(y)
        assert np.array_equal(outputs[0], outputs[1])
        assert_matches_reference(outputs[0], x, w, None, **params)


def test_masked_fmas_only_on_64_byte_vectors():
    for dtype_name, lanes in (("float32", 8), ("float64", 4)):
        with pytest.raises(ValueError, match="masked_fmas needs 64-byte vectors"):
            build_row_tap_kernel(5, 5, 1, 1, 1, 2, 4, 1, dtype_name, lanes, masked_fmas=True)


def test_mask_registers_only_where_numba_compiles_for_avx512(monkeypatch):
    from numba.core import config

    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+fma,-avx512f")
    assert not target_has_mask_registers()
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+avx512f,+avx512vl")
    assert target_has_mask_registers()
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    monkeypatch.setattr(config, "CPU_NAME", "generic")
    assert not target_has_mask_registers()
