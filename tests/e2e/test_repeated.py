"""Repeated calls of one problem (cso.repeated): each is as correct as the
first, with new operand values every time, whichever way its plan reads
its filters."""

import numpy as np
import pytest

import cso
from cso import executor
from cso.analysis.choices import KCRS_ALGORITHMS, activation_code
from cso.repeated import RepeatedCall
from conftest import activate, activation_bound, assert_matches_reference, error_bound

# (x shape, w shape, params, forced plan settings, how the plan reads its filters)
PLANS = [
    ((1, 32, 28, 28), (32, 1, 3, 3), dict(padding=1, groups=32), {}, "kcrs"),
    ((1, 96, 14, 14), (96, 1, 5, 5), dict(padding=2, stride=2, groups=96), {}, "kcrs"),
    ((1, 64, 14, 14), (64, 4, 3, 3), dict(padding=1, groups=16), dict(algorithm="grouped"), "kcrs"),
    ((2, 24, 20, 20), (40, 24, 1, 1), {},
     dict(vector_operand="windows", filters_per_tile=8), "in place"),
    ((1, 20, 9, 9), (10, 20, 3, 3), dict(padding=1),
     dict(vector_operand="windows", filters_per_tile=14), "edge tile packed"),
    ((1, 16, 15, 15), (40, 16, 3, 3), dict(padding=1),
     dict(vector_operand="filters", schedule="IS"), "panels packed"),
]  # fmt: skip


def _kind(plan) -> str:
    if plan.algorithm in KCRS_ALGORITHMS:
        return "kcrs"
    if executor.packs_panels_up_front(plan):
        return "panels packed"
    return "in place" if executor.plan_constants(plan)[1] is not None else "edge tile packed"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("problem", PLANS, ids=[p[4] + str(i) for i, p in enumerate(PLANS)])
def test_a_repeated_call_matches_the_reference_every_time(rng, problem, dtype, threads):
    x_shape, w_shape, params, forced, kind = problem
    plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, threads=threads, **params, **forced)
    assert _kind(plan) == kind
    call = RepeatedCall(plan)
    outputs = []
    for with_bias in (False, True, False):
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal(w_shape).astype(dtype)
        bias = rng.standard_normal(w_shape[0]).astype(dtype) if with_bias else None
        y = call(x, w, bias, 0)
        assert y.dtype == dtype and y.flags.c_contiguous and y.ctypes.data % 64 == 0
        assert_matches_reference(y, x, w, bias, **params)
        outputs.append(y)
    assert not np.shares_memory(outputs[0], outputs[2])


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

    def counted(self, x, w, bias, activation):
        seen.append(self.plan)
        return original(self, x, w, bias, activation)

    monkeypatch.setattr(RepeatedCall, "__call__", counted)
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
    # With out, residual or a plan a call takes the general path.
    cso.conv2d(x, w, bias, threads=threads, activation="silu", out=np.empty_like(y), **params)
    assert len(seen) == 2
    # So do packed filters' repeated calls, whatever their activation.
    packed = cso.pack_filters(w, x.shape, bias=bias, threads=threads, **params)
    for call, activation in enumerate([None, "relu6", "relu6", None]):
        y = cso.conv2d(x, packed, threads=threads, activation=activation)
        before = cso.reference.conv2d(x, w, bias, **params)
        bound = activation_bound(before, error_bound(x, w, bias, np.float32, **params), np.float32)
        assert np.all(np.abs(y - activate(activation, before)) <= bound)
        assert len(seen) == 2 + call
