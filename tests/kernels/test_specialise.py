"""Specialisations: one module (and one on-disk cache) per micro-kernel key."""

import dataclasses
import functools
import inspect
import os
import re
import subprocess
import sys
import textwrap

import numpy as np

import pytest

import cso
from cso import launch, measure
from cso.macrokernel import specialise

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, cso
    nf, nwin = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(nf)
    x = rng.standard_normal((1, 5, 9, 10)).astype(np.float32)
    w = rng.standard_normal((11, 5, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, filters_per_tile=nf,
                           windows_per_tile=nwin, threads=1)
    y = cso.conv2d(x, w, padding=1, plan=plan, threads=1)
    error = np.max(np.abs(y - cso.reference.conv2d(x, w, padding=1)))
    print(error)
""")


def test_two_processes_with_other_shapes_share_no_kernel(tmp_path):
    """Alternate two micro-kernel shapes across processes over one cache
    directory: each must load its own machine code, never the other's."""
    env = dict(os.environ, CSO_CACHE_DIR=str(tmp_path))
    # Numba's index files next to the generated modules, where they are looked for below.
    env.pop("NUMBA_CACHE_DIR", None)
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
    a = specialise.loop_module(3, 16, "float32", 16)
    assert specialise.loop_module(3, 16, "float32", 16) is a
    assert specialise.loop_module(3, 16, "float64", 8) is not a
    assert a.microkernel is not None
    assert a.VECTOR_TOKEN == (None,) * 16


def test_one_compiled_nest_serves_one_and_two_threads():
    """A module holds one nest a family, compiled once: a one-thread plan
    calls it as worker 0 on the calling thread, a two-thread plan runs its
    workers through the one shared parallel loop, by its address; both
    compute the same, and the second thread count compiles no nest."""
    from cso import executor, launch
    from cso.macrokernel import workers

    rng = np.random.default_rng(3)
    cases = (
        ((1, 5, 9, 10), (11, 5, 3, 3), 1, None),  # dense
        ((1, 16, 9, 10), (16, 1, 3, 3), 16, "depthwise"),  # taps
        ((1, 16, 9, 10), (16, 1, 3, 3), 16, "depthwise_lanes"),
    )
    for x_shape, w_shape, groups, algorithm in cases:
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        two = cso.plan_conv2d(
            x_shape, w_shape, padding=1, groups=groups, threads=2, algorithm=algorithm
        )
        results, nests = {}, {}
        for plan in (dataclasses.replace(two, threads=1), two):
            nest = launch.launch_for(plan, False).loop_nest
            if plan.threads == 1:
                assert isinstance(nest, functools.partial) and nest.args == (0,), algorithm
                nests[1] = nest.func
            else:
                assert isinstance(nest, workers.ParallelNest), algorithm
                nests[2] = nest.nest
            assert not nests[plan.threads].targetoptions.get("parallel")
            filters = executor.filter_operands(w, None, plan)
            y = np.empty(plan.geometry.output_shape, np.float32)
            results[plan.threads] = executor.run(plan, x, filters, y)
        assert nests[1] is nests[2], algorithm
        np.testing.assert_array_equal(results[1], results[2])


def test_module_file_names_carry_the_sources_hash():
    module = specialise.loop_module(3, 16, "float32", 16)
    assert specialise.source_hash() in module.__file__
    assert np.dtype("float32").name in module.__file__


def test_measurement_variants_are_patches_of_their_own():
    with pytest.raises(TypeError, match="patch"):
        specialise.loop_module(3, 16, "float32", 16, "windows", "fast")
    skeleton = specialise.loop_module(3, 16, "float32", 16, patch=measure.VARIANTS["skeleton"])
    assert skeleton is not specialise.loop_module(3, 16, "float32", 16)
    assert "_skeleton_" in skeleton.__file__
    with pytest.raises(ValueError, match="variant"):
        measure.plan_program(None, None, None, variant="fast")


@pytest.mark.parametrize("variant", ["outlined", "tile-by-tile", "no-prefetch"])
def test_variants_that_keep_the_arithmetic_compute_the_same(variant):
    # experiments/variants.py times them against the shipped loops: same bits or it is no baseline.
    import cso

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((20, 16, 3, 3)).astype(np.float32)
    # The dense nests' variants (a 3x3 stride-1 layer may be planned Winograd).
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, threads=1, algorithm="dense")
    shipped = measure.plan_program(plan, x, w)().copy()
    assert np.array_equal(shipped, cso.conv2d(x, w, padding=1, plan=plan))
    assert np.array_equal(shipped, measure.plan_program(plan, x, w, variant=variant)())


def test_a_variant_reads_filters_packed_in_the_nest_as_the_call_does():
    # A filter-vectorised WS plan with its window tiles in one block packs each
    # filter tile in its nest from KCRS: a variant's launch must not take the
    # KCRS array for packed panels (it did: ResNet-50's `l4 1x1 2048->512 @7`
    # came out wrong through every variant, and bench --breakdown timed that).
    import cso

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 7, 7)).astype(np.float32)
    w = rng.standard_normal((48, 64, 1, 1)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, vector_operand="filters", schedule="WS", threads=1)
    assert plan.packs_filters_in_nest
    shipped = measure.plan_program(plan, x, w)().copy()
    assert np.array_equal(shipped, cso.conv2d(x, w, plan=plan))
    assert np.array_equal(shipped, measure.plan_program(plan, x, w, variant="no-prefetch")())


def test_stage_times_add_up_to_the_total():
    import cso

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 32, 40, 40)).astype(np.float32)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, threads=1, algorithm="dense")
    stages = measure.stage_times(plan, x, w, rounds=5)
    assert set(stages) == {"total", "kernel", "input packing", "filters", "rest"}
    parts = stages["kernel"] + stages["input packing"] + stages["filters"] + stages["rest"]
    # The stages are differences of best times, each off by the machine's noise
    # (on a quiet machine their sum is the total within a few percent; a
    # shared one moved it by half in CI): within a factor of three, and the
    # micro-kernel's share above none.  Speed itself is the bench's, not a test's.
    assert stages["total"] / 3 <= parts <= 3 * stages["total"]
    assert stages["kernel"] > 0


@pytest.mark.parametrize("algorithm", ["depthwise", "depthwise_lanes"])
def test_depthwise_nests_have_stages_of_their_own(algorithm):
    # bench --breakdown times every layer's stages, depthwise ones included.
    import cso

    # A layer of a few hundred microseconds: the stages are differences of
    # times, and on 30x30 planes of 32 channels (tens of microseconds) the
    # other test worker's compiling once pushed their sum out of the band.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    w = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, padding=1, groups=64, threads=1, algorithm=algorithm)
    shipped = measure.plan_program(plan, x, w)()
    assert np.allclose(shipped, cso.conv2d(x, w, padding=1, groups=64, plan=plan))
    stages = measure.stage_times(plan, x, w, rounds=5)
    expected = {"total", "kernel", "input packing", "filters", "rest"}
    if algorithm == "depthwise_lanes":
        expected.add("output unpacking")
    assert set(stages) == expected
    parts = sum(seconds for stage, seconds in stages.items() if stage != "total")
    # Differences of best times (see test_stage_times_add_up_to_the_total).
    assert stages["total"] / 3 <= parts <= 3 * stages["total"]
    module = launch.loop_module_for(plan, measure.variants_for(plan)["no-kernel"])
    assert "_no_kernel_" in module.__file__ and module is not launch.loop_module_for(plan)
    with pytest.raises(ValueError, match="kernel options"):
        launch.loop_module_for(plan, measure.VARIANTS["no-prefetch"])


def test_a_variant_reads_packed_dot_product_filters_as_the_call_does():
    # Dot-product panels are KCRS rows read in place: a variant's launch must
    # take the operands' own layout, not assume packed panels.
    import cso

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64, 7, 7)).astype(np.float32)
    w = rng.standard_normal((40, 64, 7, 7)).astype(np.float32)
    plan = cso.plan_conv2d(
        x.shape, w.shape, vector_operand="reduction", filters_prepacked=True, threads=1
    )
    packed = cso.pack_filters(w, x.shape, plan=plan)
    shipped = measure.plan_program(plan, x, w, prepacked=packed)().copy()
    assert np.array_equal(shipped, cso.conv2d(x, packed, threads=1))
    outlined = measure.plan_program(plan, x, w, variant="outlined", prepacked=packed)
    assert np.array_equal(shipped, outlined())


def _cso_imports(module) -> set:
    """The cso modules ``module``'s source imports (absolute or relative)."""
    import ast
    import importlib.util

    tree = ast.parse(open(module.__file__).read())
    package = module.__name__.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                # `from ..microkernels import taps` names a module; `from .x import f` a name in x.
                candidate = f"{base}.{alias.name}"
                try:
                    is_module = importlib.util.find_spec(candidate) is not None
                except ModuleNotFoundError:  # base is a module, not a package
                    is_module = False
                found.add(candidate if is_module else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("cso.")}


def test_the_hash_covers_every_kernel_source_a_hashed_source_imports():
    # A source left out would let an edited kernel load a stale compiled module.
    hashed = {module.__name__ for module in specialise.HASHED_SOURCES}
    kernel_packages = ("cso.microkernels.", "cso.packing.", "cso.macrokernel.")
    missing = {
        (module.__name__, imported)
        for module in specialise.HASHED_SOURCES
        for imported in _cso_imports(module)
        if imported.startswith(kernel_packages) and imported not in hashed
    }
    assert not missing
    assert {"cso.microkernels.tile_stores", "cso.microkernels.dot_products"} <= hashed
    # And every other cso module a kernel source reads (the analysis a kernel is
    # generated from), and every kernel a specialisation's binding names.
    read = {
        imported
        for module in specialise.HASHED_SOURCES
        if module.__name__.startswith(kernel_packages)
        for imported in _cso_imports(module)
    }
    bound = set(re.findall(r"cso\.(?:microkernels|packing)\.\w+", inspect.getsource(specialise)))
    # (cso.numba_cache locks Numba's cache files around saves and loads: it
    # generates no code, so an edit to it changes no compiled module.)
    assert not (read | bound) - hashed - {"cso.cachedir", "cso.geometry", "cso.numba_cache"}


def test_the_parallel_loop_refuses_arrays_of_two_dtypes():
    # The nest's address is found by the first array's dtype: any other
    # floating-point array in another dtype is refused before a call.
    from numba.core.errors import TypingError

    from cso.macrokernel import workers

    single, double = np.zeros(4, np.float32), np.zeros(4)
    arguments = (single, double) + (single,) * 8 + ((1, 2),)
    with pytest.raises(TypingError, match="arrays are all float32"):
        workers.run_workers(0, 1, *arguments)


@pytest.mark.parametrize("distance", [0, 8])
def test_the_machines_prefetch_distance_specialises_the_loop_module(distance):
    # Hardware.kernel_prefetch_distance (set by the calibration) picks the
    # kernel's software prefetch: a module of its own, the same bits.
    import cso

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 24, 18, 18)).astype(np.float32)
    w = rng.standard_normal((20, 24, 3, 3)).astype(np.float32)
    made = cso.plan_conv2d(x.shape, w.shape, padding=1, threads=1)

    def with_distance(steps):
        hardware = dataclasses.replace(made.hardware, kernel_prefetch_distance=steps)
        return dataclasses.replace(made, hardware=hardware)

    plan, other = with_distance(16), with_distance(distance)
    assert launch.loop_module_for(other).__name__ != launch.loop_module_for(plan).__name__
    assert f"_p{distance}_" in launch.loop_module_for(other).__name__
    y = cso.conv2d(x, w, padding=1, plan=other)
    assert np.array_equal(y, cso.conv2d(x, w, padding=1, plan=plan))
    assert np.abs(y - cso.reference.conv2d(x, w, padding=1)).max() < 1e-3


def test_compiled_code_reads_and_sets_each_openmp_runtimes_count():
    # launch_workers keeps the OpenMP counts through these calls: each must
    # reach the same runtime cso.openmp reads through ctypes.
    from numba import njit

    from cso import openmp
    from cso.macrokernel.workers import openmp_count, set_openmp_count

    @njit
    def read_then_set(addresses, count):
        seen = np.empty(addresses.size // 2, np.int64)
        for runtime in range(seen.size):
            seen[runtime] = openmp_count(addresses[2 * runtime])
            set_openmp_count(addresses[2 * runtime + 1], count)
        return seen

    addresses = openmp.runtime_addresses()
    if addresses.size == 0:
        pytest.skip("no OpenMP runtime reachable")
    before = openmp.openmp_threads()
    try:
        assert list(read_then_set(addresses, 5)) == before
        assert openmp.openmp_threads() == [5] * len(before)
    finally:
        openmp.restore_counts(before)
    assert openmp.openmp_threads() == before
