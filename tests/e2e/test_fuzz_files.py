"""Fuzzing the files cso reads back: packed filters, tuned stores, hardware.json.

Hypothesis edits one field of the file's JSON (replaced by a hostile value or
removed), with the packed file's checksums recomputed or not, or flips a
byte.  What cso does with the result must be the documented error (or
warning), or a result bit-identical to the untouched file's (or, where the
edit leaves a different but runnable plan, one that matches the reference).
"""

import json
import os
import tempfile
import warnings

import numpy as np
import pytest
from conftest import assert_matches_reference, resign_packed_metadata
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import cso
from cso.analysis import detect
from cso.packed_file import PackedFormatError
from cso.tuned_store import TunedPlans

PARAMS = dict(stride=(1, 2), padding=((1, 0), (2, 1)), groups=2)
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

HOSTILE_VALUES = st.one_of(
    st.integers(-3, 40),
    st.sampled_from(
        [10**6, 10**12, 2**63, -(2**31), 1e308, 0.5, -0.0, "", "x", "float16", "IS", "WS",
         "filters", "reduction", "depthwise", None, True, False, [], {}, [0, 0], [1, 1, 1]]
    ),
)


def node_paths(document, prefix=()):
    """Every path to a value inside ``document`` (dict keys, list indices)."""
    if prefix:
        yield prefix
    if isinstance(document, dict):
        for key, value in document.items():
            yield from node_paths(value, prefix + (key,))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from node_paths(value, prefix + (index,))


def mutate(document, data):
    """A copy of ``document`` with one value replaced or removed, drawn from ``data``."""
    document = json.loads(json.dumps(document))
    path = data.draw(st.sampled_from(sorted(node_paths(document), key=repr)), label="path")
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and data.draw(st.booleans(), label="remove"):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(HOSTILE_VALUES, label="value")
    return document


# -- packed filters -----------------------------------------------------------


@pytest.fixture(scope="module")
def packed_case():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 8, 11, 12)).astype(np.float32)
    w = rng.standard_normal((20, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    packed = cso.pack_filters(w, x.shape, bias=b, **PARAMS)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "packed.npz")
        cso.save_packed(path, {"conv": packed})
        with np.load(path, allow_pickle=False) as archive:
            members = {name: archive[name] for name in archive.files}
        with open(path, "rb") as handle:
            raw = handle.read()
    metadata = json.loads(members.pop("__metadata__").tobytes().decode())
    return x, w, b, cso.conv2d(x, packed), members, metadata, raw


def load_or_refuse(path):
    try:
        return cso.load_packed(path)["conv"]
    except PackedFormatError:
        return None


@FUZZ
@given(data=st.data(), resigned=st.booleans())
def test_an_edited_packed_file_is_refused_or_computes_correctly(packed_case, data, resigned):
    x, w, b, expected, members, metadata, _ = packed_case
    edited = mutate(metadata, data)
    if resigned:
        resign_packed_metadata(edited, members)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "packed.npz")
        np.savez(
            path, **members, __metadata__=np.frombuffer(json.dumps(edited).encode(), np.uint8)
        )
        loaded = load_or_refuse(path)
    event("refused" if loaded is None else "loaded")
    if loaded is None:
        return
    try:
        y = cso.conv2d(x, loaded)
    except ValueError as error:  # a loaded plan for another input shape is said so
        assert "x must have shape" in str(error)
        return
    if resigned:
        assert_matches_reference(y, x, w, b, **loaded.conv_params)
    else:
        assert np.array_equal(y, expected)


@FUZZ
@given(position=st.integers(0, 10**9), bits=st.integers(1, 255))
def test_a_packed_file_with_a_flipped_byte_is_refused_or_bit_identical(
    packed_case, position, bits
):
    x, _, _, expected, _, _, raw = packed_case
    damaged = bytearray(raw)
    damaged[position % len(damaged)] ^= bits
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "packed.npz")
        with open(path, "wb") as handle:
            handle.write(bytes(damaged))
        loaded = load_or_refuse(path)
    event("refused" if loaded is None else "loaded")
    if loaded is not None:
        assert np.array_equal(cso.conv2d(x, loaded), expected)


# -- the tuned-plans store ----------------------------------------------------

X_SHAPE, W_SHAPE = (1, 8, 10, 10), (12, 8, 3, 3)


@pytest.fixture(scope="module")
def tuned_case():
    rng = np.random.default_rng(8)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    plan = cso.plan_conv2d(X_SHAPE, W_SHAPE, padding=1, threads=1, vector_operand="filters")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plans.json")
        TunedPlans(path).put(plan)
        with open(path) as handle:
            content = json.load(handle)
    untuned = cso.conv2d(x, w, padding=1, threads=1)
    return x, w, content, untuned


@FUZZ
@given(data=st.data())
def test_an_edited_tuned_store_is_ignored_with_a_warning_or_computes_correctly(
    tuned_case, data
):
    x, w, content, untuned = tuned_case
    edited = mutate(content, data)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plans.json")
        with open(path, "w") as handle:
            json.dump(edited, handle)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = cso.conv2d(x, w, padding=1, threads=1, tuned=path)
    ignored = any("ignored" in str(warning.message) for warning in caught)
    event("ignored" if ignored else "used")
    if ignored:
        assert np.array_equal(y, untuned)
    else:
        assert_matches_reference(y, x, w, padding=1)


# -- hardware.json --------------------------------------------------------------


@pytest.fixture(scope="module")
def probed():
    return detect.probe()


@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_an_edited_hardware_json_is_probed_again_or_describes_a_real_machine(
    probed, data, monkeypatch, rng
):
    described = {name: getattr(probed, name) for name in detect.PROBED_FIELDS}
    edited = mutate({"key": detect.machine_key(), "probed": described}, data)
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "hardware.json"), "w") as handle:
            json.dump(edited, handle)
        with monkeypatch.context() as patch:
            patch.setenv("CSO_CACHE_DIR", folder)
            patch.setattr(detect, "probe", lambda: probed)
            detect.stored_or_probed.cache_clear()
            try:
                hardware = detect.stored_or_probed()
            finally:
                detect.stored_or_probed.cache_clear()
    event("probed again" if hardware == probed else "accepted")
    if hardware == probed:
        return
    # A description that was accepted is one the code can plan and run for.
    x = rng.standard_normal((1, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((10, 6, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, hardware=hardware, threads=1)
    assert_matches_reference(cso.conv2d(x, w, padding=1, plan=plan), x, w, padding=1)
