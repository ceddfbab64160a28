"""Tuned stores, hardware.json, environment variables, the cache directory and
out-of-range parameters: each hostile or mistaken setting gets the documented
error or warning, never a foreign exception, a hang or a huge allocation
(issue 23)."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import assert_matches_reference

import cso
from cso.analysis import detect
from cso.geometry import make_geometry
from cso.tuned_store import STORE_FORMAT, STORE_VERSION, TunedPlans

X_SHAPE, W_SHAPE = (1, 8, 10, 10), (12, 8, 3, 3)


@pytest.fixture
def operands(rng):
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    return x, w


@pytest.fixture
def store(tmp_path):
    """A store holding the analysis' plan for the problem, at one thread."""
    path = tmp_path / "plans.json"
    TunedPlans(path).put(cso.plan_conv2d(X_SHAPE, W_SHAPE, padding=1, threads=1))
    return path


def edit_entries(path, change) -> None:
    content = json.loads(path.read_text())
    for entry in content["entries"].values():
        change(entry)
    path.write_text(json.dumps(content))


def untuned(x, w):
    return cso.conv2d(x, w, padding=1, threads=1)


# -- the tuned-plans store ----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"format": "cso-tuned-plans", "version": 2, "entries": ' + "[" * 100_000
        + "]" * 100_000 + "}",
        '{"format": "cso-tuned-plans", "version": 2, "entries": {"k": 1e400}}',
    ],
    ids=["nested-100000-deep", "1e400"],
)
def test_a_store_nested_deep_or_out_of_range_is_ignored_with_a_warning(
    tmp_path, operands, text
):
    path = tmp_path / "plans.json"
    path.write_text(text)
    x, w = operands
    with pytest.warns(RuntimeWarning, match="ignored"):
        y = cso.conv2d(x, w, padding=1, threads=1, tuned=path)
    assert np.array_equal(y, untuned(x, w))


@pytest.mark.parametrize(
    "field, value", [("windows_per_tile", 0), ("windows_per_tile", 16000), ("threads", 0)]
)
def test_a_stored_plan_the_code_cannot_run_is_ignored_with_a_warning(
    store, operands, field, value
):
    edit_entries(store, lambda entry: entry.update({field: value}))
    x, w = operands
    with pytest.warns(RuntimeWarning, match="malformed"):
        y = cso.conv2d(x, w, padding=1, threads=1, tuned=store)
    assert np.array_equal(y, untuned(x, w))


def test_a_stored_plan_for_another_machine_is_ignored(store, operands):
    edit_entries(store, lambda entry: entry["hardware"].update(l2_bytes=1 << 22))
    x, w = operands
    with pytest.warns(RuntimeWarning, match="does not fit its key"):
        cso.conv2d(x, w, padding=1, threads=1, tuned=store)


TUNABLE = [
    # (x shape, w shape, conv params, plan settings): every kind of plan tune stores.
    ((1, 64, 7, 7), (96, 64, 3, 3), dict(padding=1), dict(vector_operand="filters")),
    ((1, 64, 7, 7), (96, 64, 3, 3), dict(padding=1), dict(vector_operand="windows")),
    ((2, 16, 7, 7), (24, 16, 3, 3), dict(padding=1), dict(fold_batch=True)),
    ((1, 32, 7, 7), (16, 32, 7, 7), {}, dict(vector_operand="reduction")),
    ((1, 32, 14, 14), (64, 32, 1, 1), {}, {}),
    ((1, 24, 15, 15), (24, 1, 3, 3), dict(padding=1, groups=24), dict(algorithm="depthwise")),
    ((1, 24, 15, 15), (24, 1, 3, 3), dict(stride=2, groups=24), dict(algorithm="depthwise")),
]


@pytest.mark.parametrize("x_shape, w_shape, params, settings", TUNABLE)
def test_every_kind_of_tuned_plan_round_trips_through_the_store(
    tmp_path, rng, monkeypatch, x_shape, w_shape, params, settings
):
    """Before, the store refused every filter-vectorised plan (``windows_per_tile
    % lanes``), including those cso.tune stores as best."""
    plan = cso.plan_conv2d(x_shape, w_shape, threads=1, **params, **settings)
    path = tmp_path / "plans.json"
    TunedPlans(path).put(plan)
    geometry = make_geometry(x_shape, w_shape, **params)
    assert TunedPlans(path).get(geometry, "float32", cso.detect_hardware(), 1) == plan
    used = []
    real_run = cso.executor.run
    monkeypatch.setattr(cso.executor, "run", lambda *a, **k: used.append(a[0]) or real_run(*a, **k))
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = cso.conv2d(x, w, threads=1, tuned=path, **params)
    assert used == [plan]
    assert_matches_reference(y, x, w, **params)


def test_tuned_of_the_wrong_type_names_tuned(operands):
    x, w = operands
    with pytest.raises(TypeError, match="tuned must be True, False or the path"):
        cso.conv2d(x, w, tuned=1)


def test_a_tuned_store_that_does_not_exist_is_said_once(tmp_path, operands):
    x, w = operands
    path = str(tmp_path / "absent.json")
    with pytest.warns(RuntimeWarning, match="absent.json does not exist"):
        y = cso.conv2d(x, w, padding=1, threads=1, tuned=path)
    assert np.array_equal(y, untuned(x, w))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cso.conv2d(x, w, padding=1, threads=1, tuned=path)  # said once


def test_the_stored_format_names_are_what_the_store_writes(store):
    content = json.loads(store.read_text())
    assert (content["format"], content["version"]) == (STORE_FORMAT, STORE_VERSION)


# -- hardware.json and the environment ----------------------------------------


@pytest.fixture(scope="module")
def probed():
    return detect.probe()  # py-cpuinfo takes seconds: once for the module


@pytest.fixture
def fresh_detection(tmp_path, monkeypatch, probed):
    """Detection reading a hardware.json in a private cache directory; the
    probes it runs are counted."""
    monkeypatch.setenv("CSO_CACHE_DIR", str(tmp_path))
    probes = []
    monkeypatch.setattr(detect, "probe", lambda: probes.append(1) or probed)
    detect.stored_or_probed.cache_clear()
    yield tmp_path / "hardware.json", probes
    monkeypatch.undo()
    detect.stored_or_probed.cache_clear()


def stored_description(probed, fields) -> str:
    described = {name: getattr(probed, name) for name in detect.PROBED_FIELDS}
    described.update(fields)
    return json.dumps({"key": detect.machine_key(), "probed": described})


def test_a_good_hardware_json_is_read_without_probing(fresh_detection, probed):
    path, probes = fresh_detection
    path.write_text(stored_description(probed, {}))
    assert detect.stored_or_probed().vector_registers == probed.vector_registers
    assert probes == []


@pytest.mark.parametrize(
    "text",
    [
        "probed-vector_registers-1000000",
        "probed-vector_bytes-1000000",
        "[" * 100_000 + "]" * 100_000,
        '{"key": 1e400}',
    ],
    ids=["registers-1e6", "vector-bytes-1e6", "nested-100000-deep", "1e400"],
)
def test_a_hostile_hardware_json_is_probed_again(fresh_detection, probed, text):
    path, probes = fresh_detection
    if text.startswith("probed-"):
        _, field, value = text.split("-")
        text = stored_description(probed, {field: int(value)})
    path.write_text(text)
    hardware = detect.stored_or_probed()
    assert probes == [1]
    assert hardware == probed
    # ... and replaced by a good description, read without probing.
    detect.stored_or_probed.cache_clear()
    assert detect.stored_or_probed() == hardware and probes == [1]


@pytest.mark.parametrize(
    "variable, value", [("CSO_VECTOR_REGISTERS", "1000000"), ("CSO_VECTOR_BYTES", "1000000")]
)
def test_environment_beyond_real_machines_names_the_variable(variable, value):
    with pytest.raises(ValueError, match=f"{variable}={value}: Hardware"):
        detect.with_environment(cso.Hardware(), {variable: value})


def test_hardware_beyond_real_machines_is_refused():
    with pytest.raises(ValueError, match="vector_registers must be between 8 and 32"):
        cso.Hardware(vector_registers=10**6)
    with pytest.raises(ValueError, match="vector_bytes must be a power of two"):
        cso.Hardware(vector_bytes=48)


# -- the cache directory ------------------------------------------------------

CACHE_SCRIPT = """
import warnings
warnings.simplefilter("always")
from cso.cachedir import cache_directory
with warnings.catch_warnings(record=True) as caught:
    first = cache_directory()
    second = cache_directory()
print(first)
print(len(caught))
print(caught[0].message if caught else "")
"""


def test_an_unusable_cache_directory_warns_once_and_reuses_one_fallback(tmp_path):
    """A path under a regular file cannot be created, even by root (a read-only
    directory can be, by root).  Two processes: one fallback, named."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    unusable = blocker / "cache"
    environment = dict(os.environ, CSO_CACHE_DIR=str(unusable), HOME=str(blocker))
    runs = [
        subprocess.run(
            [sys.executable, "-c", CACHE_SCRIPT],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for _ in range(2)
    ]
    outputs = [run.stdout.splitlines() for run in runs]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    (first, count, message), (again, _, _) = outputs
    assert first == again  # one fallback across processes
    assert count == "1" and str(unusable) in message and first in message


# -- parameters out of range -------------------------------------------------


def test_a_stride_beyond_int32_is_refused_before_any_work(operands):
    x, w = operands
    with pytest.raises(ValueError, match="stride must be <= 2147483647"):
        cso.conv2d(x, w, stride=2**63)


def test_padding_that_makes_an_output_too_large_names_the_padding(operands):
    x, w = operands
    with pytest.raises(ValueError, match="check padding"):
        cso.conv2d(x, w, padding=10**9)


def test_planning_or_packing_for_an_empty_batch_names_the_batch():
    with pytest.raises(ValueError, match=r"x_shape\[0\] \(N\) must be >= 1"):
        cso.plan_conv2d((0, 16, 12, 12), (8, 16, 3, 3))
    with pytest.raises(ValueError, match=r"input_shape\[0\] \(N\) must be >= 1"):
        cso.pack_filters(np.ones((8, 16, 3, 3), np.float32), (0, 16, 12, 12))
