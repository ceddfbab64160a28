"""cso leaves the process's thread settings as it found them: the OpenMP
thread count (which torch and any other OpenMP user share with Numba's
OpenMP layer) and NumPy's BLAS threads.

Each check runs in a fresh process, so that cso's first call, the one that
starts Numba's thread pool, is among those checked; the calls run twice,
since a plan's first launch keeps the counts from Python and the later ones
in compiled code (cso.macrokernel.workers.launch_workers).
"""

import ast
import os
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


def run_python(source: str, environment=None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
        timeout=600, env={**os.environ, **(environment or {})},
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


PROBE = """
import os
import numba
import numpy as np
from cso import openmp
from cso.macrokernel.workers import launch_workers, nest_address

@numba.njit
def probe(worker, ids, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    ids[worker] = numba.get_thread_id()

def launch(workers, counts):
    ids = np.full(workers, -1.0)
    arguments = (ids,) + (0,) * 10
    launch_workers(nest_address(probe, arguments), workers, counts, *arguments)
    return sorted(ids.tolist())
"""


@pytest.mark.parametrize("team", [True, False], ids=["team", "numba-loop"])
def test_a_launch_runs_its_workers_whatever_numba_thread_count_and_sets_it_back(team):
    """A plan's launch runs its workers on as many threads when Numba's
    count is lower, and leaves the count as it was, cso's calls included:
    through its own parallel region (``team``: cso.macrokernel.team, which
    sets no count) and through Numba's loop (the team's functions not
    found), which raises Numba's count in compiled code and sets it back."""
    output = run_python(
        PROBE
        + f"""
counts = openmp.launch_addresses()
found = bool(counts[openmp.TEAM_SLOT]) if {team} else bool(counts[0])
if not {team}:
    counts = counts.copy()
    counts[openmp.TEAM_SLOT : openmp.RUNTIME_SLOTS] = 0
numba.set_num_threads(1)
ids = launch(2, counts)
after_launch = numba.get_num_threads()
import cso
x = np.ones((1, 16, 9, 9), np.float32)
for _ in range(3):
    cso.conv2d(x, np.ones((16, 1, 3, 3), np.float32), groups=16, threads=2)
    cso.conv2d(x, np.ones((8, 16, 3, 3), np.float32), threads=2)
print([found, ids, after_launch, numba.get_num_threads()])
"""
    )
    found, ids, after_launch, after_calls = ast.literal_eval(output.strip().splitlines()[-1])
    if not found:
        pytest.skip("this process has no OpenMP team launch" if team else "no C count getter")
    assert ids == [0.0, 1.0] and after_launch == 1 == after_calls


def test_a_team_smaller_than_its_workers_runs_every_worker():
    """Under ``OMP_THREAD_LIMIT=1`` the runtime gives a parallel region one
    thread: the team's thread runs all three workers in turn."""
    output = run_python(
        PROBE
        + """
counts = openmp.launch_addresses()
print([bool(counts[openmp.TEAM_SLOT]), launch(3, counts)])
""",
        environment={"OMP_THREAD_LIMIT": "1"},
    )
    found, ids = ast.literal_eval(output.strip().splitlines()[-1])
    if not found:
        pytest.skip("this process has no OpenMP team launch")
    assert ids == [0.0, 0.0, 0.0]


def test_a_forked_child_launches_through_numba_loop():
    """GNU OpenMP's threads do not survive a fork: a child forked after a
    launch finds the team's addresses cleared (Numba's loop, which takes
    over, checks for the fork itself)."""
    output = run_python(
        PROBE
        + """
counts = openmp.launch_addresses()
launch(2, counts)
before = bool(counts[openmp.TEAM_SLOT])
child = os.fork()
if child == 0:
    cleared = not any(openmp.launch_addresses()[openmp.TEAM_SLOT : openmp.RUNTIME_SLOTS])
    os._exit(0 if cleared else 1)
_, status = os.waitpid(child, 0)
print([before, os.waitstatus_to_exitcode(status), bool(counts[openmp.TEAM_SLOT])])
"""
    )
    before, child_status, after = ast.literal_eval(output.strip().splitlines()[-1])
    if not before:
        pytest.skip("this process has no OpenMP team launch")
    assert child_status == 0 and after
