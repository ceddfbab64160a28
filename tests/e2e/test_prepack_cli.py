"""The cso-prepack script: a real run, and every bad input it must refuse."""

import json
import subprocess
import sys

import numpy as np
import pytest

import cso
from cso.prepack import main


@pytest.fixture
def model(tmp_path, rng):
    weights = {
        "conv1": rng.standard_normal((16, 3, 7, 7)).astype(np.float32),
        "conv2": rng.standard_normal((8, 16, 3, 3)).astype(np.float32),
        "conv2_bias": rng.standard_normal(8).astype(np.float32),
    }
    spec = {
        "conv1": {"input_shape": [1, 3, 32, 32], "stride": 2, "padding": 3},
        "conv2": {
            "input_shape": [1, 16, 16, 16],
            "padding": [[1, 1], [0, 2]],
            "bias": "conv2_bias",
        },
    }
    np.savez(tmp_path / "weights.npz", **weights)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return tmp_path, weights, spec


def _run(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "cso.prepack", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def test_prepack_round_trip(model, rng, capsys):
    folder, weights, spec = model
    assert (
        main(
            [
                str(folder / "weights.npz"),
                "--spec",
                str(folder / "spec.json"),
                "-o",
                str(folder / "packed.npz"),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "packed 2 layers" in captured.out
    assert "[1/2] conv1" in captured.err and "[2/2] conv2" in captured.err
    layers = cso.load_packed(folder / "packed.npz")
    x = rng.standard_normal((1, 16, 16, 16)).astype(np.float32)
    expected = cso.reference.conv2d(
        x, weights["conv2"], weights["conv2_bias"], padding=((1, 1), (0, 2))
    )
    assert np.allclose(cso.conv2d(x, layers["conv2"]), expected, rtol=1e-4, atol=1e-3)


def test_console_script_is_installed():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("cso-prepack") == "cso.prepack:main"


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing weights", "no such file"),
        ("missing spec", "no such file"),
        ("bad json", "bad JSON"),
        ("array without spec", "arrays with no spec entry: ['extra']"),
        ("spec without array", "layer 'ghost' of the spec has no array"),
        ("wrong shape", "layer 'conv2'"),
        ("unknown key", "unknown keys ['strides']"),
        ("not npz", "not a readable .npz"),
        ("array named a/b", "layer name 'a/b' cannot be stored"),
        ("array named __metadata__", "layer name '__metadata__' cannot be stored"),
        ("bias as a list", "'bias' must be the name of an array"),
        ("spec nested deep", "nested 100001 deep"),
    ],
)
def test_bad_inputs_exit_non_zero(model, case, message):
    folder, weights, spec = model
    weights_path, spec_path = folder / "weights.npz", folder / "spec.json"
    if case == "missing weights":
        weights_path = folder / "absent.npz"
    elif case == "missing spec":
        spec_path = folder / "absent.json"
    elif case == "bad json":
        spec_path.write_text("{ not json")
    elif case == "array without spec":
        np.savez(weights_path, **weights, extra=np.ones((2, 2, 1, 1)))
    elif case == "spec without array":
        spec["ghost"] = {"input_shape": [1, 3, 8, 8]}
        spec_path.write_text(json.dumps(spec))
    elif case == "wrong shape":
        spec["conv2"]["input_shape"] = [1, 15, 16, 16]
        spec_path.write_text(json.dumps(spec))
    elif case == "unknown key":
        spec["conv1"]["strides"] = 2
        spec_path.write_text(json.dumps(spec))
    elif case == "not npz":
        weights_path.write_text("plain text")
    elif case.startswith("array named"):
        name = case.split()[-1]
        np.savez(weights_path, **weights, **{name: np.ones((2, 2, 1, 1), np.float32)})
        spec[name] = {"input_shape": [1, 2, 4, 4]}
        spec_path.write_text(json.dumps(spec))
    elif case == "bias as a list":
        spec["conv2"]["bias"] = [1.0] * 8
        spec_path.write_text(json.dumps(spec))
    elif case == "spec nested deep":
        spec_path.write_text('{"conv1": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = _run(folder, weights_path, "--spec", spec_path, "-o", folder / "out.npz")
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (folder / "out.npz").exists()


def test_an_output_that_is_a_directory_is_refused_and_leaves_nothing(model):
    folder, weights, spec = model
    before = set(folder.iterdir())
    result = _run(folder, folder / "weights.npz", "--spec", folder / "spec.json", "-o", ".")
    assert result.returncode == 1
    assert "is a directory" in result.stderr and "Traceback" not in result.stderr
    assert set(folder.iterdir()) == before
