"""Property-based: cso.conv2d against the float64 im2col + GEMM reference."""

import numba
import numpy as np
from conftest import assert_matches_reference
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cso
from cso.geometry import make_geometry


@st.composite
def problems(draw):
    groups = draw(st.sampled_from([1, 1, 1, 2, 3]))
    channels = groups * draw(st.integers(1, 6))
    filters = groups * draw(st.integers(1, 18))
    R, S = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = draw(st.one_of(st.integers(1, 3), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    dilation = draw(st.one_of(st.just(1), st.tuples(st.integers(1, 2), st.integers(1, 2))))
    padding = draw(
        st.one_of(
            st.integers(0, 2),
            st.tuples(st.integers(0, 2), st.integers(0, 3)),
            st.tuples(
                st.tuples(st.integers(0, 3), st.integers(0, 1)),
                st.tuples(st.integers(0, 1), st.integers(0, 3)),
            ),
            st.just("same"),
            st.just("valid"),
        )
    )
    if padding == "same":
        stride = 1
    H, W = draw(st.integers(1, 13)), draw(st.integers(1, 40))
    batch = draw(st.integers(1, 3))
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    try:
        g = make_geometry((batch, channels, H, W), (filters, channels // groups, R, S), **params)
    except ValueError:
        assume(False)
    return (batch, channels, H, W), (filters, channels // groups, R, S), params, g


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problem=problems(),
    dtype=st.sampled_from([np.float32, np.float64]),
    schedule=st.sampled_from(["IS", "WS"]),
    vector_operand=st.sampled_from(["windows", "filters"]),
    threads=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    fold_batch=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_conv2d_matches_reference(
    problem, dtype, schedule, vector_operand, threads, with_bias, fold_batch, seed
):
    x_shape, w_shape, params, _ = problem
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    bias = rng.standard_normal(w_shape[0]).astype(dtype) if with_bias else None
    plan = cso.plan_conv2d(
        x_shape,
        w_shape,
        dtype=dtype,
        schedule=schedule,
        threads=threads,
        vector_operand=vector_operand,
        fold_batch=fold_batch,
        **params,
    )
    assert plan.vector_operand == vector_operand
    assert plan.batch_folded == fold_batch
    y = cso.conv2d(x, w, bias, threads=threads, plan=plan, **params)
    assert y.dtype == dtype
    assert_matches_reference(y, x, w, bias, **params)


@settings(max_examples=25, deadline=None)
@given(
    problem=problems(),
    seed=st.integers(0, 2**32 - 1),
    l1=st.sampled_from([2048, 8192, 49152]),
    l2=st.sampled_from([16384, 262144]),
    fold_batch=st.sampled_from([None, True]),
)
def test_any_tiling_is_correct(problem, seed, l1, l2, fold_batch):
    """Tiny injected caches force many channel tiles and small K2/K3 (blocks
    of tiles that span images, when the batch is folded)."""
    x_shape, w_shape, params, _ = problem
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    hardware = cso.detect_hardware().with_changes(l1_bytes=l1, l2_bytes=l2, l3_bytes=4 * l2)
    for schedule in ("IS", "WS"):
        plan = cso.plan_conv2d(
            x_shape, w_shape, hardware=hardware, schedule=schedule, fold_batch=fold_batch, **params
        )
        assert_matches_reference(cso.conv2d(x, w, plan=plan, **params), x, w, **params)


@st.composite
def fully_connected(draw):
    """A classifier layer as a convolution: one window, the whole input."""
    groups = draw(st.sampled_from([1, 1, 2]))
    channels = groups * draw(st.integers(1, 40))
    filters = groups * draw(st.integers(1, 20))
    height, width = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    batch = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 2))
    return (
        (batch, channels, height, width),
        (filters, channels // groups, height, width),
        dict(stride=stride, groups=groups),
    )


@settings(max_examples=40, deadline=None)
@given(
    problem=fully_connected(),
    dtype=st.sampled_from([np.float32, np.float64]),
    threads=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    prepacked=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_dot_product_plans_match_reference(problem, dtype, threads, with_bias, prepacked, seed):
    """A dot-product plan (filters and input read in place, for a whole-input
    window) must be exact for any channels, filters, groups, batch and edge
    tile, per call and with filters packed ahead."""
    x_shape, w_shape, params = problem
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    bias = rng.standard_normal(w_shape[0]).astype(dtype) if with_bias else None
    if prepacked:
        # The analysis' own choice (dot products but for the smallest layers).
        packed = cso.pack_filters(w, x_shape, bias=bias, dtype=dtype, threads=threads, **params)
        y = cso.conv2d(x, packed, threads=threads)
    else:
        plan = cso.plan_conv2d(
            x_shape, w_shape, dtype=dtype, threads=threads, vector_operand="reduction", **params
        )
        y = cso.conv2d(x, w, bias, threads=threads, plan=plan, **params)
    assert_matches_reference(y, x, w, bias, **params)
