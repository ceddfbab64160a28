"""Repeated calls of one problem (cso.repeated): each is as correct as the
first, with new operand values every time, whichever way its plan reads
its filters."""

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cso
from cso import executor
from cso.analysis.choices import KCRS_ALGORITHMS, activation_code
from cso.repeated import UNALIGNED_OUTPUT_ALGORITHMS, RepeatedCall
from conftest import activate, activation_bound, assert_matches_reference, error_bound
from test_properties import problems

# (x shape, w shape, params, forced plan settings, how the plan reads its filters)
PLANS = [
    ((1, 32, 28, 28), (32, 1, 3, 3), dict(padding=1, groups=32), {}, "kcrs"),
    ((1, 96, 14, 14), (96, 1, 5, 5), dict(padding=2, stride=2, groups=96), {}, "kcrs"),
    ((1, 64, 14, 14), (64, 4, 3, 3), dict(padding=1, groups=16), dict(algorithm="grouped"), "kcrs"),
    # Winograd: KCRS filters, transformed in the nest (or packed ahead, transformed).
    ((1, 12, 14, 10), (20, 12, 3, 3), dict(padding=1), dict(algorithm="winograd"), "kcrs"),
    ((2, 24, 20, 20), (40, 24, 1, 1), {},
     dict(vector_operand="windows", filters_per_tile=8), "in place"),
    ((1, 20, 9, 9), (10, 20, 3, 3), dict(padding=1),
     dict(vector_operand="windows", filters_per_tile=14), "edge tile packed"),
    ((1, 16, 15, 15), (40, 16, 3, 3), dict(padding=1),
     dict(vector_operand="filters", schedule="IS"), "panels packed"),
    # Dot products (a 1x1 plane): KCRS rows, packed ahead or not.
    ((1, 64, 1, 1), (16, 64, 1, 1), {}, dict(vector_operand="reduction"), "in place"),
    ((2, 48, 1, 1), (5, 48, 1, 1), {}, dict(vector_operand="reduction"), "edge tile packed"),
]  # fmt: skip


def _kind(plan) -> str:
    if plan.algorithm in KCRS_ALGORITHMS:
        return "kcrs"
    if executor.packs_panels_up_front(plan):
        return "panels packed"
    return "in place" if executor.plan_constants(plan)[1] is not None else "edge tile packed"


def _every_plan(test):
    """``test`` on each of PLANS, in float32 and float64, at one and two threads."""
    test = pytest.mark.parametrize(
        "problem", PLANS, ids=[p[4] + str(i) for i, p in enumerate(PLANS)]
    )(test)
    test = pytest.mark.parametrize("dtype", [np.float32, np.float64])(test)
    return pytest.mark.parametrize("threads", [1, 2])(test)


def _operands(rng, x_shape, w_shape, dtype, with_bias) -> tuple:
    """New ``(x, w, bias)`` of ``dtype``, the bias None unless ``with_bias``."""
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    return x, w, rng.standard_normal(w_shape[0]).astype(dtype) if with_bias else None


@_every_plan
def test_a_repeated_call_matches_the_reference_every_time(rng, problem, dtype, threads):
    x_shape, w_shape, params, forced, kind = problem
    plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, threads=threads, **params, **forced)
    assert _kind(plan) == kind
    call = RepeatedCall(plan)
    outputs = []
    for with_bias in (False, True, False):
        x, w, bias = _operands(rng, x_shape, w_shape, dtype, with_bias)
        y = call(x, w, bias, 0)
        assert y.dtype == dtype and y.flags.c_contiguous
        # On a cache line, but for the families whose nests it does not speed up.
        assert plan.algorithm in UNALIGNED_OUTPUT_ALGORITHMS or y.ctypes.data % 64 == 0
        assert_matches_reference(y, x, w, bias, **params)
        outputs.append(y)
        # The residual, in another dtype and not contiguous, and an activation.
        residual = rng.standard_normal(y.shape + (2,))[..., 0]
        y = call(x, w, bias, activation_code("relu"), residual)
        before = cso.reference.conv2d(x, w, bias, **params) + residual
        # One more rounding: the sum with the residual (and the residual's to dtype).
        added = 2 * np.abs(before) * np.finfo(dtype).eps
        bound = activation_bound(before, error_bound(x, w, bias, dtype, **params) + added, dtype)
        assert np.all(np.abs(y - activate("relu", before)) <= bound)
    assert not np.shares_memory(outputs[0], outputs[2])


@_every_plan
def test_a_quick_call_matches_the_reference_every_time(rng, problem, dtype, threads):
    # RepeatedCall.quick_call: the call's arguments prepared once, for every
    # way of reading filters but those that pack a tile or panels per call;
    # operands of other types (read-only) refused before any work.
    from cso.macrokernel.workers import launch_typed, launch_workers
    from cso.quick_launch import launch_kcrs

    x_shape, w_shape, params, forced, kind = problem
    plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, threads=threads, **params, **forced)
    call = RepeatedCall(plan)
    for with_bias in (False, True):
        x, w, bias = _operands(rng, x_shape, w_shape, dtype, with_bias)
        call(x, w, bias, activation_code("relu"))  # finds the nest's address
        quick = call.quick_call(activation_code("relu"), x, w, bias)
        assert (quick is None) == (kind in ("panels packed", "edge tile packed"))
        if quick is None:
            continue
        nest = call.launch.loop_nest
        compiled = len((nest.func if threads == 1 else nest.nest).overloads)
        launches = [len(f.overloads) for f in (launch_workers, launch_typed, launch_kcrs)]
        outputs = []
        for read_only in (False, True, False):
            x, w, bias = _operands(rng, x_shape, w_shape, dtype, with_bias)
            # Read-only operands take __call__'s copies: nothing compiled again.
            for operand in (x, w) if read_only else ():
                operand.flags.writeable = False
            try:
                y = quick(x, w, bias)
                assert not read_only, "a read-only operand must be refused"
            except TypeError:
                # Refused before any work: the caller takes __call__'s copies.
                assert read_only
                y = call(x, w, bias, activation_code("relu"))
            assert y.dtype == dtype and y.shape == plan.geometry.output_shape
            expected = cso.reference.conv2d(x, w, bias, **params)
            bound = activation_bound(expected, error_bound(x, w, bias, dtype, **params), dtype)
            assert np.all(np.abs(y - activate("relu", expected)) <= bound)
            outputs.append(y)
        assert not np.shares_memory(outputs[0], outputs[2])
        assert len((nest.func if threads == 1 else nest.nest).overloads) == compiled
        assert [len(f.overloads) for f in (launch_workers, launch_typed, launch_kcrs)] == launches
    # Operands of another dtype than the plan's need converting: no quick call.
    other = np.float64 if dtype == np.float32 else np.float32
    x = rng.standard_normal(x_shape).astype(other)
    assert call.quick_call(0, x, rng.standard_normal(w_shape).astype(dtype), None) is None


@pytest.fixture
def general_calls(monkeypatch) -> list:
    """A list that grows by one at each call through ``RepeatedCall.__call__``."""
    general = []
    original = RepeatedCall.__call__

    def counted(self, *arguments):
        general.append(1)
        return original(self, *arguments)

    monkeypatch.setattr(RepeatedCall, "__call__", counted)
    return general


def test_conv2d_takes_the_quick_call_once_it_has_one(rng, general_calls):
    general = general_calls
    params = dict(padding=1, groups=32)
    for _ in range(4):
        x = rng.standard_normal((1, 32, 16, 16)).astype(np.float32)
        w = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
        y = cso.conv2d(x, w, threads=2, **params)
        assert_matches_reference(y, x, w, None, **params)
    # The first call plans, the second runs RepeatedCall and makes the quick call.
    assert len(general) == 1
    # With packed filters, the quick call applies the activation it was made
    # for; another takes RepeatedCall, and so does a residual.
    w = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)
    packed = cso.pack_filters(w, x.shape, bias=bias, threads=2, **params)
    for call, activation in enumerate(["relu", "relu", "relu", None, "relu"]):
        x = rng.standard_normal((1, 32, 16, 16)).astype(np.float32)
        y = cso.conv2d(x, packed, threads=2, activation=activation)
        expected = cso.reference.conv2d(x, w, bias, **params)
        bound = activation_bound(expected, error_bound(x, w, bias, np.float32, **params),
                                 np.float32)  # fmt: skip
        assert np.all(np.abs(y - activate(activation, expected)) <= bound)
    assert len(general) == 1 + 2  # the second call's and the one without activation
    residual = rng.standard_normal(y.shape).astype(np.float32)
    y = cso.conv2d(x, packed, threads=2, activation="relu", residual=residual)
    expected = cso.reference.conv2d(x, w, bias, **params) + residual
    bound = error_bound(x, w, bias, np.float32, **params) + np.abs(expected) * 1e-7
    assert np.all(np.abs(y - activate("relu", expected)) <= bound) and len(general) == 4


@pytest.mark.parametrize("threads", [1, 2])
def test_conv2d_converts_what_its_quick_call_refuses(rng, threads, general_calls):
    """Once a problem has its quick call (a compiled one: a depthwise plan),
    operands of other types than it was compiled for (read-only, strided,
    Fortran-ordered) take RepeatedCall's conversions, with the right result;
    the quick call is kept for the next plain call."""
    general = general_calls
    params = dict(padding=2, groups=24)
    w = rng.standard_normal((24, 1, 5, 5)).astype(np.float32)
    for _ in range(3):  # plans, then makes the quick call
        x = rng.standard_normal((1, 24, 14, 14)).astype(np.float32)
        cso.conv2d(x, w, threads=threads, **params)
    assert len(general) == 1
    read_only = rng.standard_normal((1, 24, 14, 14)).astype(np.float32)
    read_only.flags.writeable = False
    strided = rng.standard_normal((1, 24, 14, 28)).astype(np.float32)[..., ::2]
    fortran = np.asfortranarray(rng.standard_normal((1, 24, 14, 14)).astype(np.float32))
    for x in (read_only, strided, fortran):
        y = cso.conv2d(x, w, threads=threads, **params)
        assert_matches_reference(y, x, w, None, **params)
    assert len(general) == 1 + 3
    x = rng.standard_normal((1, 24, 14, 14)).astype(np.float32)
    assert_matches_reference(cso.conv2d(x, w, threads=threads, **params), x, w, None, **params)
    assert len(general) == 1 + 3


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("problem", PLANS, ids=[p[4] + str(i) for i, p in enumerate(PLANS)])
def test_a_repeated_call_on_packed_filters_matches_the_reference(rng, problem, threads):
    x_shape, w_shape, params, forced, _ = problem
    plan = cso.plan_conv2d(x_shape, w_shape, threads=threads, filters_prepacked=True, **params,
                           **forced)  # fmt: skip
    w = rng.standard_normal(w_shape).astype(np.float32)
    bias = rng.standard_normal(w_shape[0]).astype(np.float32)
    for with_bias in (False, True):
        packed = cso.pack_filters(w, x_shape, plan=plan, bias=bias if with_bias else None,
                                  **params)  # fmt: skip
        call = RepeatedCall(packed.plan, prepacked=True)
        for activation in (None, "relu"):
            x = rng.standard_normal(x_shape).astype(np.float32)
            y = call(x, packed.panels, packed.bias, activation_code(activation))
            expected = cso.reference.conv2d(x, w, bias if with_bias else None, **params)
            bound = error_bound(x, w, bias if with_bias else None, np.float32, **params)
            assert np.all(np.abs(y - activate(activation, expected)) <= bound)


@pytest.mark.parametrize("threads", [1, 2])
def test_conv2d_repeats_through_the_prepared_call(rng, threads, monkeypatch):
    seen = []
    original = RepeatedCall.__call__

    def counted(self, *arguments):
        seen.append(self.plan)
        return original(self, *arguments)

    monkeypatch.setattr(RepeatedCall, "__call__", counted)
    # Every repeated call through __call__ (the quick call is tested below).
    monkeypatch.setattr(RepeatedCall, "quick_call", lambda self, *arguments: None)
    params = dict(padding=1, groups=48)
    for call in range(3):
        big = rng.standard_normal((1, 48, 12, 24)).astype(np.float32)
        x = big[:, :, :, ::2]  # not contiguous
        w = rng.standard_normal((48, 1, 3, 3)).astype(np.float32)
        w.flags.writeable = False
        bias = rng.standard_normal(48).astype(np.float32)
        y = cso.conv2d(x, w, bias, threads=threads, activation="silu", **params)
        before = cso.reference.conv2d(x, w, bias, **params)
        bound = activation_bound(before, error_bound(x, w, bias, np.float32, **params), np.float32)
        assert np.all(np.abs(y - activate("silu", before)) <= bound)
        assert x.base is big and not w.flags.writeable  # the operands as given
        # The first call plans; each one after it is a repeated call.
        assert len(seen) == call
    # A residual is fused on the repeated path too, the output's own values...
    residual = rng.standard_normal(y.shape).astype(np.float32)
    y = cso.conv2d(x, w, bias, threads=threads, activation="silu", residual=residual, **params)
    before = cso.reference.conv2d(x, w, bias, **params) + residual
    bound = activation_bound(
        before, error_bound(x, w, bias, np.float32, **params) + np.abs(before) * 1e-7, np.float32
    )
    assert np.all(np.abs(y - activate("silu", before)) <= bound) and len(seen) == 3
    # ...checked as the general path checks it.
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        cso.conv2d(x, w, bias, threads=threads, activation="silu", residual=residual[:, :1],
                   **params)  # fmt: skip
    # With out or a plan a call takes the general path.
    cso.conv2d(x, w, bias, threads=threads, activation="silu", out=np.empty_like(y), **params)
    assert len(seen) == 3
    # So do packed filters' repeated calls, whatever their activation.
    packed = cso.pack_filters(w, x.shape, bias=bias, threads=threads, **params)
    for call, activation in enumerate([None, "relu6", "relu6", None]):
        y = cso.conv2d(x, packed, threads=threads, activation=activation)
        before = cso.reference.conv2d(x, w, bias, **params)
        bound = activation_bound(before, error_bound(x, w, bias, np.float32, **params), np.float32)
        assert np.all(np.abs(y - activate(activation, before)) <= bound)
        assert len(seen) == 3 + call
    y = cso.conv2d(x, packed, threads=threads, residual=residual)
    expected = cso.reference.conv2d(x, w, bias, **params) + residual
    bound = error_bound(x, w, bias, np.float32, **params) + np.abs(expected) * 1e-7
    assert np.all(np.abs(y - expected) <= bound) and len(seen) == 7


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problem=problems(),
    threads=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_analysis_plans_repeated_calls_match_the_reference(problem, threads, with_bias, seed):
    x_shape, w_shape, params, _ = problem
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    rng = np.random.default_rng(seed)
    # The second call of a problem takes the repeated path, the third its quick call.
    for _ in range(3):
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        bias = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
        y = cso.conv2d(x, w, bias, threads=threads, **params)
        assert_matches_reference(y, x, w, bias, **params)


@pytest.mark.parametrize("bias", [False, True])
def test_a_plain_repeated_call_finds_its_problem_without_the_general_path(rng, bias, monkeypatch):
    # conv2d's in-line lookup builds _call_key's key itself: were the two to
    # drift apart, repeated calls would fall to the general path, which
    # builds the key through _call_key.
    from cso import conv

    keys = []
    original = conv._call_key
    monkeypatch.setattr(conv, "_call_key", lambda *a: keys.append(1) or original(*a))
    x = rng.standard_normal((1, 24, 10, 10)).astype(np.float32)
    w = rng.standard_normal((24, 1, 5, 5)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32) if bias else None
    for call in range(3):
        y = cso.conv2d(x, w, b, padding=2, groups=24, threads=1, activation="relu")
        expected = cso.reference.conv2d(x, w, b, padding=2, groups=24)
        bound = activation_bound(expected, error_bound(x, w, b, np.float32, padding=2, groups=24),
                                 np.float32)  # fmt: skip
        assert np.all(np.abs(y - activate("relu", expected)) <= bound)
        assert len(keys) == 1  # the first call's, which validates and plans
