"""cso leaves the process's thread settings as it found them: the OpenMP
thread count (which torch and any other OpenMP user share with Numba's
OpenMP layer) and NumPy's BLAS threads.

Each check runs in a fresh process, so that cso's first call, the one that
starts Numba's thread pool, is among those checked; the calls run twice,
since a plan's first launch keeps the counts from Python and the later ones
in compiled code (cso.macrokernel.workers.launch_workers).
"""

import ast
import subprocess
import sys
import textwrap

import pytest

CALLS = """
import numpy as np
import cso
x = np.ones((1, 16, 9, 9), np.float32)
w = np.ones((8, 16, 3, 3), np.float32)
def calls():
    cso.conv2d(x, w, padding=1)                              # dense, all cores
    cso.conv2d(x, w, padding=1, threads=1)                   # dense, one thread
    cso.conv2d(x, cso.pack_filters(w, x.shape), activation="relu")
    cso.conv2d(x, np.ones((16, 1, 3, 3), np.float32), groups=16)   # depthwise
    # The bench's roofline stream, on two threads and one (it left 2 before).
    from cso.microkernels.stream import stream_seconds
    stream_seconds(1 << 16, 1 << 16, 2, rounds=1, min_seconds=0)
    stream_seconds(1 << 16, 1 << 16, 1, rounds=1, min_seconds=0)
"""


def run_python(source: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_openmp_thread_count_is_unchanged_by_cso_calls():
    """Set to 3 in every OpenMP runtime Numba's layer can reach (the process's
    global one and the one its OpenMP pool links), it stays 3."""
    output = run_python(
        CALLS
        + """
import ctypes
from numba.np.ufunc import omppool
runtimes = []
for library in (ctypes.CDLL(None), ctypes.CDLL(omppool.__file__)):
    try:
        runtimes.append((library.omp_get_max_threads, library.omp_set_num_threads))
    except AttributeError:
        pass
assert runtimes, "no OpenMP runtime reachable"
for get, set_ in runtimes:
    set_(3)  # a count no call uses: a launch that set its own would show
calls()
calls()
print([get() for get, _ in runtimes])
"""
    )
    counts = eval(output.strip().splitlines()[-1])
    assert counts and all(count == 3 for count in counts), counts


def test_torch_thread_count_is_unchanged_by_cso_calls():
    pytest.importorskip("torch")
    output = run_python(
        """
import torch
torch.set_num_threads(1)
"""
        + CALLS
        + """
calls()
calls()
print(torch.get_num_threads())
"""
    )
    assert output.strip().splitlines()[-1] == "1"


def test_blas_threads_are_unchanged_by_cso_calls():
    pytest.importorskip("threadpoolctl")
    output = run_python(
        CALLS
        + """
from threadpoolctl import threadpool_info, threadpool_limits
threadpool_limits(1, user_api="blas")
def blas():
    return {pool["filepath"]: pool["num_threads"] for pool in threadpool_info()
            if pool["user_api"] == "blas"}
before = blas()
calls()
calls()
after = blas()
# Libraries loaded during the calls are not the caller's settings: those before are compared.
print(all(after[path] == count for path, count in before.items()), before, after)
"""
    )
    assert output.strip().splitlines()[-1].startswith("True"), output


def test_the_quick_thread_count_follows_numba_set_num_threads():
    """``executor.numba_thread_count`` (Numba's getter without its lock) reads
    what ``numba.get_num_threads`` does, first call included, as the calling
    thread's count changes."""
    output = run_python(
        """
        import numba
        from cso.executor import numba_thread_count
        seen = [(numba_thread_count(), numba.get_num_threads())]
        for count in (1, numba.config.NUMBA_NUM_THREADS, 1):
            numba.set_num_threads(count)
            seen.append((numba_thread_count(), numba.get_num_threads()))
        print(seen)
        """
    )
    seen = ast.literal_eval(output)
    assert all(quick == public for quick, public in seen), seen
    assert seen[1][0] == 1 == seen[3][0]


def test_a_launch_raises_numba_thread_count_to_its_workers_and_sets_it_back():
    """A plan's launch runs its workers on as many threads when Numba's
    count is lower (cso.macrokernel.workers.launch_workers raises it in
    compiled code), and leaves the count as it was, cso's calls included."""
    output = run_python(
        """
        import numba
        import numpy as np
        from cso import openmp
        from cso.macrokernel.workers import launch_workers, nest_address

        @numba.njit
        def probe(worker, ids, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
            ids[worker] = numba.get_thread_id()

        counts = openmp.launch_addresses()
        numba.set_num_threads(1)
        ids = np.full(2, -1.0)
        arguments = (ids,) + (0,) * 10
        launch_workers(nest_address(probe, arguments), 2, counts, *arguments)
        after_launch = numba.get_num_threads()
        import cso
        x = np.ones((1, 16, 9, 9), np.float32)
        for _ in range(3):
            cso.conv2d(x, np.ones((16, 1, 3, 3), np.float32), groups=16, threads=2)
            cso.conv2d(x, np.ones((8, 16, 3, 3), np.float32), threads=2)
        print([bool(counts[0]), sorted(ids.tolist()), after_launch, numba.get_num_threads()])
        """
    )
    found, ids, after_launch, after_calls = ast.literal_eval(output.strip().splitlines()[-1])
    if not found:
        pytest.skip("this Numba keeps no C thread-count getter")
    assert ids == [0.0, 1.0] and after_launch == 1 == after_calls
