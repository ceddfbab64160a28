"""The Winograd family (F(2x2, 3x3), dense 3x3 stride-1 layers): against
the float64 reference with its own error bound, with epilogues, packed,
other kernel shapes, and chosen by the model."""

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
    winograd_error_bound,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis.choices import Algorithm
from cso.geometry import make_geometry


@st.composite
def winograd_problems(draw):
    # Planes narrower and wider than a transform call's 16 tiles, odd and
    # even sizes (a last tile half outside the output), asymmetric padding
    # up to 2 (a tile's input reaching past both ends), filter counts that
    # leave a partial filter tile.
    channels = draw(st.integers(1, 20))
    filters = draw(st.integers(1, 20))
    padding = draw(
        st.tuples(
            st.tuples(st.integers(0, 2), st.integers(0, 2)),
            st.tuples(st.integers(0, 2), st.integers(0, 2)),
        )
    )
    H, W = draw(st.integers(1, 20)), draw(st.integers(1, 40))
    batch = draw(st.integers(1, 3))
    params = dict(padding=padding)
    x_shape, w_shape = (batch, channels, H, W), (filters, channels, 3, 3)
    try:
        make_geometry(x_shape, w_shape, **params)
    except ValueError:
        assume(False)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threads = draw(st.sampled_from([1, min(2, cso.executor.available_threads())]))
    return x_shape, w_shape, params, dtype, threads, draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(winograd_problems(), st.integers(0, 2**32 - 1))
def test_winograd_matches_the_reference(problem, seed):
    x, w, b, plan = check_tap_plan(problem, seed, "winograd")
    # Within the Winograd computation's own bound too, not only the larger
    # of it and the direct one that assert_matches_reference takes.
    params = problem[2]
    y = cso.conv2d(x, w, b, plan=plan, **params)
    error = np.abs(y - cso.reference.conv2d(x, w, b, **params))
    assert np.all(error <= winograd_error_bound(x, w, b, y.dtype, **params))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_resnet_layer_sizes_match_the_reference(rng, dtype, threads):
    # Blocks of whole kernel calls, several blocks a worker, 64 channels.
    threads = min(threads, cso.executor.available_threads())
    x = rng.standard_normal((1, 64, 30, 30)).astype(dtype)
    w = rng.standard_normal((72, 64, 3, 3)).astype(dtype)
    b = rng.standard_normal(72).astype(dtype)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, dtype=dtype, threads=threads,
                           algorithm="winograd")  # fmt: skip
    y = cso.conv2d(x, w, b, padding=1, plan=plan)
    assert_matches_reference(y, x, w, b, padding=1)
    error = np.abs(y - cso.reference.conv2d(x, w, b, padding=1))
    assert np.all(error <= winograd_error_bound(x, w, b, dtype, padding=1))


@pytest.mark.parametrize("shape", [(16, 16), (8, 32), (14, 32), (8, 48), (1, 16)])
def test_every_products_kernel_shape_matches_the_reference(rng, shape):
    x = rng.standard_normal((2, 9, 11, 13)).astype(np.float32)
    w = rng.standard_normal((17, 9, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, algorithm="winograd")
    plan = dataclasses.replace(plan, filters_per_tile=shape[0], windows_per_tile=shape[1])
    assert_matches_reference(cso.conv2d(x, w, padding=1, plan=plan), x, w, padding=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_epilogue(dtype):
    check_every_epilogue((2, 6, 9, 7), (10, 6, 3, 3), dict(padding=1), dtype, "winograd", 3)


def test_packed_filters_round_trip(rng, tmp_path):
    check_tap_round_trip(rng, tmp_path, np.float32, (2, 5, 12, 10), (9, 5, 3, 3),
                         dict(padding=((1, 0), (2, 1))), "winograd")  # fmt: skip


def test_inf_and_nan_propagate(rng):
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    x[0, 1, 3, 3] = np.nan
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, algorithm="winograd")
    y = cso.conv2d(x, w, padding=1, plan=plan)
    expected = cso.reference.conv2d(x, w, padding=1)
    assert np.array_equal(np.isnan(y), np.isnan(expected))


@pytest.mark.parametrize(
    "params, w_shape",
    [
        (dict(stride=2, padding=1), (8, 8, 3, 3)),
        (dict(dilation=2, padding=2), (8, 8, 3, 3)),
        (dict(padding=2), (8, 8, 5, 5)),
        (dict(padding=1, groups=2), (8, 4, 3, 3)),
    ],
)
def test_forcing_winograd_where_it_does_not_run_names_what_it_needs(params, w_shape):
    with pytest.raises(ValueError, match="algorithm='winograd' needs one group, 3x3 filters"):
        cso.plan_conv2d((1, 8, 12, 12), w_shape, algorithm="winograd", **params)


@pytest.mark.parametrize(
    "x_shape, w_shape",
    [((1, 64, 56, 56), (64, 64, 3, 3)), ((1, 512, 7, 7), (512, 512, 3, 3)),
     ((1, 3, 32, 32), (16, 3, 3, 3))],
)  # fmt: skip
def test_the_model_takes_the_cheapest_of_winograd_and_dense(x_shape, w_shape):
    check_cheapest_family(x_shape, w_shape, dict(padding=1), ["dense", "winograd"])


@pytest.mark.parametrize("prepacked", [False, True])
def test_the_model_runs_resnets_large_3x3_layers_as_winograd_and_small_ones_dense(prepacked):
    # 2.25x fewer multiply-adds repay the transforms where the filters are
    # few against the tiles; at 14x14 and 7x7 the transformed filters exceed
    # L2 and serve 49 or 16 tiles a call (streams_filters_once).
    def algorithm(channels, size, batch=1):
        shape = (batch, channels, size, size)
        plan = cso.plan_conv2d(
            shape, (channels, channels, 3, 3), padding=1, hardware=AVX512_CORE,
            filters_prepacked=prepacked,
        )  # fmt: skip
        return plan.algorithm

    assert algorithm(64, 56) == Algorithm.WINOGRAD
    assert algorithm(128, 28) == Algorithm.WINOGRAD
    assert algorithm(256, 14) == Algorithm.DENSE
    assert algorithm(512, 7) == Algorithm.DENSE


def test_filters_streamed_once_a_call_keep_winograd_out_unless_forced():
    from cso.analysis.winograd import streams_filters_once

    def plan(channels, size, batch):
        return cso.plan_conv2d((batch, channels, size, size), (channels, channels, 3, 3),
                               padding=1, hardware=AVX512_CORE, algorithm="winograd")  # fmt: skip

    assert streams_filters_once(plan(256, 14, 1))  # 4 MiB of U, 49 tiles
    assert not streams_filters_once(plan(256, 14, 4))  # 196 tiles a call
    assert not streams_filters_once(plan(128, 28, 1))  # 1 MiB of U fits L2
    assert "not taken unforced" in cso.explain(plan(256, 14, 1))
    assert "not taken unforced" not in cso.explain(plan(128, 28, 1))


def test_explain_tells_the_winograd_story():
    plan = cso.plan_conv2d((1, 64, 56, 56), (64, 64, 3, 3), padding=1, algorithm="winograd",
                           hardware=AVX512_CORE)  # fmt: skip
    text = cso.explain(plan)
    assert "Winograd F(2x2, 3x3)" in text
    assert "28 x 28 = 784 tiles" in text
    assert "dense plan" in text and "Loop nest" in text


def test_stage_times_split_the_winograd_nest(rng):
    from cso import measure

    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, algorithm="winograd")
    times = measure.stage_times(plan, x, w, rounds=1)
    assert set(times) == {
        "total", "kernel", "input packing", "output unpacking", "filters", "rest"
    }  # fmt: skip
    assert times["total"] > 0
    # Each variant leaves the shipped nest's arithmetic where it keeps it.
    shipped = measure.plan_program(plan, x, w)()
    assert_matches_reference(shipped, x, w, padding=1)


def test_a_winograd_plan_is_checked_for_its_layer_and_kernel():
    plan = cso.plan_conv2d((1, 8, 10, 10), (8, 8, 3, 3), padding=1, algorithm="winograd")
    with pytest.raises(ValueError, match="vector_operand='windows'"):
        dataclasses.replace(plan, vector_operand="filters")
    strided = cso.plan_conv2d((1, 8, 10, 10), (8, 8, 3, 3), padding=1, stride=2)
    with pytest.raises(ValueError, match="a Winograd plan needs one group, 3x3 filters"):
        dataclasses.replace(plan, geometry=strided.geometry)


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_filters_are_the_transformed_filters(rng, threads):
    # Packed ahead, U is stored: the call transforms nothing, gives the same
    # bits, and replans for another batch size or thread count on the same
    # transformed filters (their layout follows the kernel's Nf, kept).
    from cso.packing.winograd_filters import transformed_elements

    threads = min(threads, cso.executor.available_threads())
    x = rng.standard_normal((2, 12, 14, 9)).astype(np.float32)
    w = rng.standard_normal((19, 12, 3, 3)).astype(np.float32)
    b = rng.standard_normal(19).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, algorithm="winograd",
                           filters_prepacked=True, threads=threads)  # fmt: skip
    packed = cso.pack_filters(w, x.shape, bias=b, padding=1, plan=plan)
    assert packed.panels.size == transformed_elements(w.shape, plan.filters_per_tile, "float32")[1]
    y = cso.conv2d(x, packed, threads=threads)
    assert np.array_equal(y, cso.conv2d(x, w, b, padding=1, plan=plan))
    for other_threads in (1, min(2, cso.executor.available_threads())):
        assert np.array_equal(cso.conv2d(x[1:], packed, threads=other_threads), y[1:])


def test_packed_ahead_the_model_does_not_charge_the_filter_transform():
    shapes = dict(x_shape=(1, 512, 7, 7), w_shape=(512, 512, 3, 3), padding=1,
                  hardware=AVX512_CORE, algorithm="winograd")  # fmt: skip
    per_call = cso.plan_conv2d(**shapes)
    ahead = cso.plan_conv2d(**shapes, filters_prepacked=True)
    assert ahead.cost_of("IS").cost < per_call.cost_of("IS").cost
    assert ahead.filters_prepacked and not per_call.filters_prepacked


@pytest.mark.parametrize("threads", [1, 2])
def test_repeated_calls_through_conv2d_take_the_quick_call(rng, threads, monkeypatch):
    # cso.conv2d's third call of a problem is its compiled quick call
    # (cso.quick_launch), which calls the nest by address, where the first
    # two go through the dispatcher: each checked against the reference.
    from cso import conv
    from cso.analysis.planner import plan_for_geometry

    def winograd_planner(*args, **kwargs):
        return plan_for_geometry(*args, **{**kwargs, "algorithm": Algorithm.WINOGRAD})

    monkeypatch.setattr(conv, "plan_for_geometry", winograd_planner)
    threads = min(threads, cso.executor.available_threads())
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((1, 31, 27, 26)).astype(dtype)
        w = rng.standard_normal((66, 31, 3, 3)).astype(dtype)
        for bias in (None, rng.standard_normal(66).astype(dtype)):
            for _ in range(4):
                y = cso.conv2d(x, w, bias, padding=1, threads=threads)
                assert_matches_reference(y, x, w, bias, padding=1)
