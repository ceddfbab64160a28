"""Every experiment script starts and describes itself (``--help``)."""

import pathlib
import subprocess
import sys

import pytest

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[2] / "experiments"
SCRIPTS = (
    sorted(path for path in EXPERIMENTS.glob("*.py") if path.name != "harness.py")
    if EXPERIMENTS.is_dir()
    else []
)


@pytest.mark.skipif(not SCRIPTS, reason="no experiments/ beside the tests")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_experiment_prints_its_help(script):
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")
    # The description is the script's docstring, whose first line says what it measures.
    assert len(result.stdout.splitlines()) > 2


def test_every_experiment_is_listed_in_the_readme():
    readme = (EXPERIMENTS / "README.md").read_text()
    for script in SCRIPTS:
        assert f"experiments/{script.name}" in readme, script.name
