"""cso.numba_cache: cached functions' saves and loads hold a lock beside
their index, so that processes compiling one function for different types
at once leave an index whose every entry names its own machine code."""

import os
import subprocess
import sys

import numba
import pytest

from cso import numba_cache

pytestmark = pytest.mark.skipif(numba_cache.fcntl is None, reason="no flock here")

MODULE = '''
import sys
import numba
sys.path.insert(0, {directory!r})
from cso.numba_cache import guard_module


@numba.njit(cache=True)
def scaled(x):
    return x * 3 + 1


guard_module(sys.modules[__name__])
'''

# Each process compiles the function for its own types, the two at once;
# each read of the index waits a little, so that two saves meet in the window
# where an unguarded one has read the index and not yet written it.
COMPILE = '''
import sys
import time
import numpy as np
from numba.core import caching
sys.path.insert(0, {directory!r})
read_index = caching.IndexDataCacheFile._load_index


def slow_read(self):
    index = read_index(self)
    time.sleep(0.05)
    return index


caching.IndexDataCacheFile._load_index = slow_read
import guarded
for dtype in {dtypes!r}:
    for ndim in (1, 2, 3):
        guarded.scaled(np.ones((2,) * ndim, dtype))
'''

# A fresh process loads every overload and checks what it computes.
CHECK = '''
import sys
import numpy as np
sys.path.insert(0, {directory!r})
import guarded
for dtype in {dtypes!r}:
    for ndim in (1, 2, 3):
        x = np.arange(2 ** ndim, dtype=dtype).reshape((2,) * ndim)
        assert (guarded.scaled(x) == x * 3 + 1).all(), (dtype, ndim)
print(len(guarded.scaled.overloads), sum(guarded.scaled.stats.cache_hits.values()))
'''


def test_guard_wraps_saves_and_loads_once():
    @numba.njit(cache=True)
    def cached(x):
        return x + 1

    @numba.njit
    def uncached(x):
        return x + 1

    guarded = numba_cache.guard(cached)
    assert guarded is cached
    cache_file = cached._cache._cache_file
    save, load = cache_file.save, cache_file.load
    assert save.cso_guarded and load.cso_guarded
    numba_cache.guard(cached)
    assert cache_file.save is save and cache_file.load is load  # not wrapped twice
    assert numba_cache.guard(uncached) is uncached


def test_processes_compiling_one_function_at_once_leave_a_sound_cache(tmp_path):
    directory = str(tmp_path)
    (tmp_path / "guarded.py").write_text(MODULE.format(directory=directory))
    first = ["int8", "int16", "int32", "int64", "uint8", "uint16"]
    second = ["float32", "float64", "uint32", "uint64", "complex64", "complex128"]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for _ in range(2):
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", COMPILE.format(directory=directory, dtypes=dtypes)],
                env=env,
            )
            for dtypes in (first, second)
        ]
        assert [run.wait(timeout=300) for run in runs] == [0, 0]
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(directory=directory, dtypes=first + second)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    overloads, hits = map(int, result.stdout.split()[:2])
    # Every overload came from the disk cache: none was missing or refused.
    assert overloads == len(first + second) * 3
    assert hits == overloads


CALLEE = """
import numba


@numba.njit
def step(x):
    return x + {increment}
"""

CALLER = """
import sys
import numba
sys.path.insert(0, {directory!r})
import callee
from cso.numba_cache import guard_module


@numba.njit(cache=True)
def stepped(x):
    return callee.step(x)


if {guarded!r}:
    guard_module(sys.modules[__name__], {directory!r})
print(stepped(1), sum(stepped.stats.cache_hits.values()))
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_change_to_a_callee_alone_makes_a_guarded_cache_stale(tmp_path, guarded):
    # Numba's stamp is the caller's own file: unguarded, the caller keeps the
    # callee's old machine code after only the callee changed; guarded, the
    # sources' fingerprint in the stamp makes it recompile.
    directory = str(tmp_path)
    (tmp_path / "caller.py").write_text(CALLER.format(directory=directory, guarded=guarded))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def run():
        result = subprocess.run(
            [sys.executable, str(tmp_path / "caller.py")],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return tuple(map(int, result.stdout.split()))

    (tmp_path / "callee.py").write_text(CALLEE.format(increment=1))
    assert run() == (2, 0)  # compiled
    assert run() == (2, 1)  # from the cache
    (tmp_path / "callee.py").write_text(CALLEE.format(increment=2))
    assert run() == ((3, 0) if guarded else (2, 1))
    if guarded:
        assert run() == (3, 1)


PARALLEL_CALLEE = """
import numba


@numba.njit(parallel=True, cache=True)
def total(x):
    sum = 0.0
    for i in numba.prange(x.size):
        sum += x[i]
    return sum
"""

PARALLEL_CALLER = """
import sys
import numba
import numpy as np
sys.path.insert(0, {directory!r})
import parallel_callee
from cso.numba_cache import guard_module


@numba.njit(cache=True)
def summed(x):
    return parallel_callee.total(x) + 1.0


guard_module(sys.modules[__name__], {directory!r})
if {step!r} == "callee":
    print(parallel_callee.total(np.ones(1000)), 0)
else:
    print(summed(np.ones(1000)), sum(summed.stats.cache_hits.values()))
"""


def test_a_cached_caller_of_a_parallel_loop_starts_the_threading_layer(tmp_path):
    # The caller is compiled in a process that loads its parallel callee from
    # the cache, so Numba saves it with nothing to start the threading layer
    # on reload; loaded first thing in a fresh process, its loop's calls into
    # the layer went to address 0 (the interpreter crashed) unless the guard
    # starts the layer before the load.
    directory = str(tmp_path)
    (tmp_path / "parallel_callee.py").write_text(PARALLEL_CALLEE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def run(step):
        (tmp_path / "caller.py").write_text(
            PARALLEL_CALLER.format(directory=directory, step=step)
        )
        result = subprocess.run(
            [sys.executable, str(tmp_path / "caller.py")],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, (step, result.returncode, result.stderr)
        return float(result.stdout.split()[0]), int(result.stdout.split()[1])

    assert run("callee") == (1000.0, 0)  # the callee compiled and cached
    assert run("caller") == (1001.0, 0)  # the caller compiled, the callee loaded
    assert run("caller") == (1001.0, 1)  # the caller loaded, first thing


def test_the_fingerprint_covers_the_sources_machine_code_comes_from():
    root = numba_cache.PACKAGE_SOURCES
    covered = {
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if numba_cache._generates_code(root, path)
    }
    # Compiled code and what its generation reads, not the interface modules.
    for name in ("quick_launch.py", "macrokernel/calling.py", "macrokernel/bounds.py",
                 "analysis/rows.py", "packing/transpose.py", "onnx/operators.py"):  # fmt: skip
        assert name in covered
    for name in ("bench.py", "conv.py", "onnx/graph.py"):
        assert name not in covered


# Templates: their functions are compiled only as the generated modules'
# copies, which cso.macrokernel.specialise guards as it imports them.
TEMPLATES = {
    f"cso.macrokernel.{name}"
    for name in ("loops", "rows", "lanes", "planes", "depthwise", "winograd")
}


def test_every_cached_function_of_the_package_is_guarded():
    import importlib
    import pkgutil

    import cso
    from numba.core.registry import CPUDispatcher

    unguarded = []
    for info in pkgutil.walk_packages(cso.__path__, "cso."):
        if info.name in TEMPLATES or info.name.startswith(("cso.__main__", "cso.dask")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            cache_file = getattr(getattr(value, "_cache", None), "_cache_file", None)
            if isinstance(value, CPUDispatcher) and value.__module__ == info.name and cache_file:
                if not getattr(cache_file.save, "cso_guarded", False):
                    unguarded.append(f"{info.name}.{name}")
    assert unguarded == []
