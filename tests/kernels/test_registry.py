"""Specialisations: one module (and one on-disk cache) per micro-kernel key."""

import os
import subprocess
import sys
import textwrap

import numpy as np

from cso.microkernels import registry

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, cso
    nf, nwin = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(nf)
    x = rng.standard_normal((1, 5, 9, 10)).astype(np.float32)
    w = rng.standard_normal((11, 5, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, filters_per_tile=nf,
                           windows_per_tile=nwin)
    y = cso.conv2d(x, w, padding=1, plan=plan)
    error = np.max(np.abs(y - cso.reference.conv2d(x, w, padding=1)))
    print(error)
""")


def test_two_processes_with_other_shapes_share_no_kernel(tmp_path):
    """Alternate two micro-kernel shapes across processes over one cache
    directory: each must load its own machine code, never the other's."""
    env = dict(os.environ, CSO_CACHE_DIR=str(tmp_path))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    for nf, nwin in ((3, 16), (5, 16), (3, 16), (5, 16)):
        result = subprocess.run(
            [sys.executable, str(script), str(nf), str(nwin)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert float(result.stdout) < 1e-4
    generated = sorted(p.name for p in tmp_path.glob("cso_loops_*.py"))
    assert (
        len(generated) == 2
        and any("_f3_" in n for n in generated)
        and any("_f5_" in n for n in generated)
    )
    # Numba wrote a cache index next to each generated module.
    assert len(list((tmp_path / "__pycache__").glob("*.nbi"))) >= 2


def test_modules_are_memoised_by_key():
    a = registry.loop_module(3, 16, "float32", 16)
    assert registry.loop_module(3, 16, "float32", 16) is a
    assert registry.loop_module(3, 16, "float64", 8) is not a
    assert a.microkernel is not None


def test_module_file_names_carry_the_sources_hash():
    module = registry.loop_module(3, 16, "float32", 16)
    assert registry._source_hash() in module.__file__
    assert np.dtype("float32").name in module.__file__


def test_measurement_variants():
    import pytest

    with pytest.raises(ValueError, match="variant"):
        registry.loop_module(3, 16, "float32", 16, "fast")
    skeleton = registry.loop_module(3, 16, "float32", 16, "skeleton")
    assert skeleton is not registry.loop_module(3, 16, "float32", 16)
    assert "_skeleton_" in skeleton.__file__


def test_outlined_variant_computes_the_same():
    # experiments/variants.py times it against the shipped loops: same bits or it is no baseline.
    import cso
    from cso.conv import _prepare_filters, _run

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((20, 16, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, threads=1)
    filters, bias = _prepare_filters(w, None, plan)
    shipped, outlined = (np.empty(plan.geometry.output_shape, np.float32) for _ in range(2))
    _run(x, filters, bias, False, shipped, plan, 1)
    _run(x, filters, bias, False, outlined, plan, 1, "outlined")
    assert np.array_equal(shipped, outlined)


def test_stage_times_add_up():
    from cso.bench import stage_times

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    stages = stage_times(x, w, {"padding": 1}, threads=1, rounds=3)
    assert set(stages) == {"total", "kernel", "input packing", "filters", "rest"}
    assert all(seconds >= 0 for seconds in stages.values())
    assert stages["kernel"] <= stages["total"] and stages["filters"] <= stages["total"]
