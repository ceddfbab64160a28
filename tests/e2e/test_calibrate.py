"""``python -m cso calibrate``: it runs, reports, writes a valid record and, with
--no-save, stores nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from cso.analysis import calibration
from cso.analysis.calibration_store import rates_from_record, store_path


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "cso", "calibrate", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _calibrations(store):
    """The calibrations the store holds (``{}`` when it does not exist)."""
    return json.loads(store.read_text()).get("machines", {}) if store.exists() else {}


def test_quick_calibration_reports_and_writes_a_valid_record(tmp_path):
    output = tmp_path / "machine.json"
    # Kernels come from the usual cache (warm in a test session), whose
    # calibrations --no-save must leave as they were.  (Its list of machines
    # already warned about their defaults may grow meanwhile: on a fresh
    # cache this run, or a test beside it, plans once before any calibration.)
    store = store_path()
    before = _calibrations(store)
    result = _run("--quick", "--no-save", "--output", str(output))
    assert result.returncode == 0, result.stderr[-2000:]
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    done, total = progress[-1][1:].split("]")[0].split("/")
    assert len(progress) == int(total) >= 15 and done == total
    for name in calibration.CALIBRATED_WEIGHTS:
        assert name in result.stdout, name
    rates = rates_from_record(json.loads(output.read_text()))
    assert rates.fma_flops > 1e9 and rates.kernel_flops > 1e9
    weights = calibration.derive_weights(rates)
    for name in calibration.CALIBRATED_WEIGHTS:
        value = getattr(weights, name)
        assert math.isfinite(value) and value >= 0, name
    assert 0.5 < weights.mac_cost < 40  # a kernel within 10x of the FMA peak
    assert _calibrations(store) == before


def test_output_must_be_a_file(tmp_path):
    result = _run("--output", str(tmp_path), "--no-save")
    assert result.returncode == 2
    assert "--output must be a file path" in result.stderr
