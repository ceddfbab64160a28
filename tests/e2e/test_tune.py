"""The autotuner on a tiny budget, and the tuned-plans store."""

import json

import numpy as np
import pytest
from conftest import AVX512_CORE, assert_matches_reference

import cso
from cso.geometry import make_geometry
from cso.tuned_store import TunedPlans, tuned_plan

X_SHAPE, W_SHAPE = (1, 16, 12, 12), (24, 16, 3, 3)


@pytest.fixture(scope="module")
def result():
    # Only the default micro-kernel shape: no extra compilation in the suite.
    default = cso.plan_conv2d(X_SHAPE, W_SHAPE, padding=1)
    return cso.tune(
        X_SHAPE,
        W_SHAPE,
        padding=1,
        threads=1,
        budget_s=0.5,
        micro_kernels=[(default.filters_per_tile, default.windows_per_tile)],
    )


def test_tuner_times_the_analysis_plan_and_returns_the_fastest(result):
    timed = [c for c in result.candidates if c.seconds is not None]
    assert [c.origin for c in timed][0] == "analysis"  # always timed, and first
    assert all(0 < c.seconds < 1 for c in timed)
    # tune() returns the plan that timed fastest, whatever the model thought of it.
    fastest = min(timed, key=lambda c: c.seconds)
    assert result.best == fastest.plan
    assert result.analysis == timed[0].plan
    assert {c.plan.schedule for c in result.candidates} == {"IS", "WS"}
    assert len(result.candidates) > len(timed) or len(timed) > 1
    table = result.table()
    assert "analysis" in table and "model cost" in table
    # Its repr is a line naming the best plan, not every candidate in full.
    text = repr(result)
    best_name = f"{result.best.algorithm.value} {cso.measure.kernel_name(result.best)}"
    assert text.startswith(f"TuneResult(best={best_name}") and "\n" not in text
    assert len(text) < 200
    analysis = repr(timed[0])
    assert analysis.startswith(f"Candidate({result.analysis.algorithm.value} ")
    assert "analysis" in analysis and "\n" not in analysis


def test_tuned_plan_computes_correctly(result, rng):
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    assert_matches_reference(cso.conv2d(x, w, padding=1, plan=result.best), x, w, padding=1)


def test_tuner_on_a_fully_connected_layer(rng):
    """The analysis' own kernel may be a dot-product one (8x1): the tuner
    keeps its orientation instead of refusing a window count of 1."""
    avx512 = AVX512_CORE
    x_shape, w_shape = (1, 64, 7, 7), (40, 64, 7, 7)
    result = cso.tune(x_shape, w_shape, threads=1, budget_s=0.3, hardware=avx512, micro_kernels=[])
    (analysis,) = [c.plan for c in result.candidates if c.origin == "analysis"]
    assert (analysis.vector_operand, analysis.windows_per_tile) == ("reduction", 1)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    assert_matches_reference(cso.conv2d(x, w, plan=result.best), x, w)


def test_budget_is_validated():
    with pytest.raises(ValueError, match="budget_s"):
        cso.tune(X_SHAPE, W_SHAPE, budget_s=0)
    with pytest.raises(ValueError, match="micro_kernels"):
        cso.tune(X_SHAPE, W_SHAPE, micro_kernels=[(14, 20)])


def test_store_round_trip_and_conv2d_opt_in(tmp_path, result, rng, monkeypatch):
    path = tmp_path / "plans.json"
    store = TunedPlans(path)
    store.put(result.best)
    geometry = make_geometry(X_SHAPE, W_SHAPE, padding=1)
    hardware = result.best.hardware
    assert store.get(geometry, "float32", hardware, 1) == result.best
    assert store.get(geometry, "float64", hardware, 1) is None  # another problem
    other = hardware.with_changes(l2_bytes=hardware.l2_bytes * 2)
    assert store.get(geometry, "float32", other, 1) is None  # another machine
    # The same machine with other cost weights (calibrated since): the measurement stands.
    recalibrated = hardware.with_changes(call_cost=hardware.weights.call_cost * 3)
    assert store.get(geometry, "float32", recalibrated, 1) == result.best
    # Nor does the kernels' prefetch the calibration chooses (the stored plan
    # keeps its own).
    other_prefetch = 0 if hardware.kernel_prefetch_distance else 16
    reprefetched = hardware.with_changes(kernel_prefetch_distance=other_prefetch)
    assert store.get(geometry, "float32", reprefetched, 1) == result.best
    # conv2d opts in: the stored plan is the one used.
    assert tuned_plan(geometry, "float32", 1, path) == result.best
    used = []
    real_run = cso.executor.run
    monkeypatch.setattr(cso.executor, "run", lambda *a, **k: used.append(a[0]) or real_run(*a, **k))
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    y = cso.conv2d(x, w, padding=1, threads=1, tuned=path)
    assert used == [result.best]
    assert_matches_reference(y, x, w, padding=1)


def test_store_of_another_version_is_never_trusted(tmp_path, result):
    path = tmp_path / "plans.json"
    TunedPlans(path).put(result.best)
    content = json.loads(path.read_text())
    content["entries"] = {
        key.replace(cso.__version__, "0.0.0-old", 1): value
        for key, value in content["entries"].items()
    }
    path.write_text(json.dumps(content))
    geometry = make_geometry(X_SHAPE, W_SHAPE, padding=1)
    assert TunedPlans(path).get(geometry, "float32", result.best.hardware, 1) is None


@pytest.mark.parametrize(
    "text",
    [
        "{ damaged",
        json.dumps({"format": "other"}),
        json.dumps({"format": "cso-tuned-plans", "version": 1, "entries": []}),
    ],
)
def test_damaged_store_is_ignored_with_a_warning(tmp_path, text):
    path = tmp_path / "plans.json"
    path.write_text(text)
    geometry = make_geometry(X_SHAPE, W_SHAPE, padding=1)
    with pytest.warns(RuntimeWarning, match="ignored"):
        assert TunedPlans(path).get(geometry, "float32", cso.detect_hardware(), 1) is None
    x = np.ones(X_SHAPE, np.float32)
    w = np.ones(W_SHAPE, np.float32)
    with pytest.warns(RuntimeWarning, match="ignored"):
        y = cso.conv2d(x, w, padding=1, tuned=path)
    assert_matches_reference(y, x, w, padding=1)


def test_malformed_entry_is_ignored(tmp_path, result):
    path = tmp_path / "plans.json"
    TunedPlans(path).put(result.best)
    content = json.loads(path.read_text())
    for value in content["entries"].values():
        value.pop("channel_tile")
    path.write_text(json.dumps(content))
    geometry = make_geometry(X_SHAPE, W_SHAPE, padding=1)
    with pytest.warns(RuntimeWarning, match="malformed"):
        assert TunedPlans(path).get(geometry, "float32", result.best.hardware, 1) is None
