"""Shared test helpers: the error bound every comparison with the reference uses."""

import dataclasses
import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import strategies as st

import cso
from cso.analysis.choices import ACTIVATIONS
from cso.analysis.winograd_rules import is_winograd
from cso.reference import (  # noqa: F401 (the Winograd reference, re-exported for the tests)
    WINOGRAD_A_T,
    WINOGRAD_B_T,
    WINOGRAD_G,
    winograd_error_bound,
    winograd_float64,
    winograd_magnitude,
)
from cso.geometry import make_geometry


# An AVX-512 core like the development machine's, for plans that must not
# depend on the machine the tests run on.
AVX512_CORE = cso.Hardware(
    l1_bytes=48 << 10,
    l2_bytes=2 << 20,
    l3_bytes=32 << 20,
    vector_bytes=64,
    vector_registers=32,
    cores=2,
)


def activate(name, x):
    """The float64 reference of a fused activation (None: the identity),
    written from PyTorch's definitions."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        sigmoid = 1.0 / (1.0 + np.exp(-x))
    hardsigmoid = np.clip(x / 6.0 + 0.5, 0.0, 1.0)
    if name == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return {
        None: x,
        "relu": np.maximum(x, 0.0),
        "relu6": np.clip(x, 0.0, 6.0),
        "sigmoid": sigmoid,
        "silu": x * sigmoid,
        "hardsigmoid": hardsigmoid,
        "hardswish": x * hardsigmoid,
    }[name]


def activation_bound(before, bound, dtype):
    """Bound on |act(computed) - act(exact)| given ``|computed - exact| <= bound``
    before the activation (``before`` the exact value): every activation here
    has slope at most 1.5 (hardswish's, at x = 3), and its own arithmetic adds
    a few roundings of the result (16 units, and one absolute for sigmoid's
    tails)."""
    u = np.finfo(dtype).eps / 2
    return 1.5 * bound + 16 * u * (np.abs(before) + 1)


def error_bound(x, w, bias, dtype, **params):
    """Elementwise bound on |cso - exact| for a float ``dtype`` computation.

    Each output is a sum of ``L = C/groups * R * S`` products plus the bias,
    accumulated in some order in ``dtype``; the classic bound for any order
    is ``gamma_(L+1) * sum |x_i w_i|`` with ``gamma_n = n u / (1 - n u)`` and
    ``u`` the unit round-off, plus one rounding of the inputs to ``dtype``
    (``2u`` on each product).  ``sum |x_i w_i|`` is the convolution of ``|x|``
    with ``|w|``, computed by the reference.

    A layer the Winograd family runs (one group, 3x3, stride and dilation
    1) may be planned either way, by the cost model of the machine the
    tests run on: its bound is the larger of that one and
    :func:`winograd_error_bound`'s.
    """
    direct = direct_error_bound(x, w, bias, dtype, **params)
    g = make_geometry(np.shape(x), np.shape(w), **params)
    if not is_winograd(g):
        return direct
    return np.maximum(direct, winograd_error_bound(x, w, bias, dtype, **params))


def direct_error_bound(x, w, bias, dtype, **params):
    """:func:`error_bound` for the direct algorithms (every family but Winograd)."""
    u = np.finfo(dtype).eps / 2
    g = make_geometry(np.shape(x), np.shape(w), **params)
    terms = g.reduction_length + 1
    gamma = (terms + 2) * u / (1 - (terms + 2) * u)
    magnitude = cso.reference.conv2d(np.abs(x), np.abs(w), **params)
    if bias is not None:
        magnitude = magnitude + np.abs(np.asarray(bias, np.float64)).reshape(1, -1, 1, 1)
    # The smallest normal number absorbs underflow in products of tiny values.
    return gamma * magnitude + np.finfo(dtype).tiny


def assert_matches_reference(y, x, w, bias=None, **params):
    expected = cso.reference.conv2d(x, w, bias, **params)
    assert y.shape == expected.shape
    bound = error_bound(x, w, bias, y.dtype, **params)
    error = np.abs(y.astype(np.float64) - expected)
    worst = np.unravel_index(np.argmax(error - bound), error.shape) if error.size else None
    assert np.all(error <= bound), (
        f"error {error[worst]:.3g} above bound {bound[worst]:.3g} at {worst}"
    )


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def resign_packed_metadata(metadata, members) -> None:
    """Recompute every layer's checksum in a packed file's ``metadata`` as the
    format documents it (canonical JSON of the entry without ``sha256``, then
    the panels, then the bias), so that a test of an edited file reaches the
    field validation and not only the checksum."""
    layers = metadata.get("layers") if isinstance(metadata, dict) else None
    for name, entry in layers.items() if isinstance(layers, dict) else ():
        if not isinstance(entry, dict) or f"{name}/panels" not in members:
            continue
        described = {key: value for key, value in entry.items() if key != "sha256"}
        digest = hashlib.sha256(
            json.dumps(described, sort_keys=True, separators=(",", ":")).encode()
        )
        digest.update(members[f"{name}/panels"].tobytes())
        if f"{name}/bias" in members:
            digest.update(members[f"{name}/bias"].tobytes())
        entry["sha256"] = digest.hexdigest()


@st.composite
def tap_filter_params(draw):
    """``(R, S, stride, dilation, padding)`` for the tap families' property
    tests (depthwise and grouped): the common filter sizes, strides and
    dilations up to 3, asymmetric padding, and "same" at stride 1."""
    size = draw(st.sampled_from([1, 2, 3, 5, 7]))
    R, S = size, draw(st.sampled_from([size, 3]))
    stride = draw(st.one_of(st.integers(1, 3), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    dilation = draw(st.one_of(st.just(1), st.tuples(st.integers(1, 2), st.integers(1, 3))))
    padding = draw(
        st.one_of(
            st.integers(0, 3),
            st.tuples(
                st.tuples(st.integers(0, 3), st.integers(0, 1)),
                st.tuples(st.integers(0, 1), st.integers(0, 3)),
            ),
            st.just("same"),
        )
    )
    if padding == "same":
        stride = 1
    return R, S, stride, dilation, padding


def check_tap_plan(problem, seed, algorithm):
    """Run ``problem`` (shapes, params, dtype, threads, whether a bias) through
    a plan forced to the tap ``algorithm``, and its one-row kernel when the
    plan holds a block of rows, against the reference; returns the operands
    and the plan for further checks."""
    x_shape, w_shape, params, dtype, threads, with_bias = problem
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if with_bias else None
    plan = cso.plan_conv2d(
        x_shape, w_shape, dtype=dtype, threads=threads, algorithm=algorithm, **params
    )
    assert plan.algorithm == algorithm
    y = cso.conv2d(x, w, b, plan=plan, **params)
    assert y.dtype == dtype
    assert_matches_reference(y, x, w, b, **params)
    if plan.rows_per_call > 1 or plan.filters_per_tile > 1:
        # The one-row, one-filter kernel too, which the model weighed against these.
        other = dataclasses.replace(plan, rows_per_call=1, filters_per_tile=1)
        assert_matches_reference(cso.conv2d(x, w, b, plan=other, **params), x, w, b, **params)
    return x, w, b, plan


def check_tap_round_trip(rng, tmp_path, dtype, x_shape, w_shape, params, algorithm):
    """Filters packed ahead for a plan forced to the tap ``algorithm``: the
    result against the reference and bit-identical to the per-call plan's,
    another batch size on the same panels, and a save and load."""
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    plan = cso.plan_conv2d(
        x.shape, w.shape, dtype=dtype, algorithm=algorithm, filters_prepacked=True, **params
    )
    packed = cso.pack_filters(w, x.shape, bias=b, plan=plan, **params)
    y = cso.conv2d(x, packed)
    assert_matches_reference(y, x, w, b, **params)
    assert np.array_equal(y, cso.conv2d(x, w, b, plan=plan, **params))
    # Another batch size reads the same panels.
    assert_matches_reference(cso.conv2d(x[:1], packed), x[:1], w, b, **params)
    path = tmp_path / f"{algorithm}.npz"
    cso.save_packed(path, {"layer": packed})
    loaded = cso.load_packed(path)["layer"]
    assert loaded.plan.algorithm == algorithm
    assert np.array_equal(cso.conv2d(x, loaded), y)


def check_every_epilogue(x_shape, w_shape, params, dtype, algorithm, seed):
    """Every activation, with and without a residual, through a plan forced
    to ``algorithm``, against the float64 reference with its bound."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    bias = rng.standard_normal(w_shape[0]).astype(dtype)
    plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, algorithm=algorithm, **params)
    residual = rng.standard_normal(plan.geometry.output_shape).astype(dtype) * 3
    exact = cso.reference.conv2d(x, w, bias, **params)
    for activation in [None] + [member.value for member in ACTIVATIONS]:
        for res in (None, residual):
            before = exact if res is None else exact + res
            bound = error_bound(x, w, bias, dtype, **params)
            if res is not None:
                bound = bound + np.finfo(dtype).eps * np.abs(res)
            y = cso.conv2d(x, w, bias, activation=activation, residual=res, plan=plan, **params)
            expected = activate(activation, before)
            assert np.all(np.abs(y - expected) <= activation_bound(before, bound, dtype)), (
                activation,
                res is not None,
            )


def check_cheapest_family(x_shape, w_shape, params, families):
    """The model's plan (on :data:`AVX512_CORE`) is the one of ``families``,
    each forced, that its cost model prices lowest: the rule, not a
    machine's outcome."""
    chosen = cso.plan_conv2d(x_shape, w_shape, hardware=AVX512_CORE, **params)
    costs = {}
    for algorithm in families:
        plan = cso.plan_conv2d(
            x_shape, w_shape, hardware=AVX512_CORE, algorithm=algorithm, **params
        )
        costs[algorithm] = plan.cost_of(plan.schedule).cost
    assert chosen.algorithm == min(costs, key=costs.get)
