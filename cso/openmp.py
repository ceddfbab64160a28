"""Leave the process's OpenMP thread count as the caller set it.

Numba's OpenMP threading layer sets the OpenMP thread count of the calling
thread (``omp_set_num_threads``) when it launches a parallel loop nest.  A
process that also runs torch, or anything else built on the same OpenMP
runtime (the loader shares one ``libgomp.so.1`` between them), then finds
its own setting changed: after ``torch.set_num_threads(1)`` and one cso
call, torch ran its next convolution on two threads.  :class:`kept_openmp_threads`
reads the count before a launch and sets it back after.  It costs two calls
into each runtime per launch; where there is no OpenMP runtime to reach it
does nothing.  A loop nest's launch makes the same calls in compiled code,
through :func:`runtime_addresses` (:func:`cso.macrokernel.workers.launch_workers`),
but for the first launch of each plan, which compiles or loads code and
starts Numba's thread pool, and so is kept from Python.  Where a runtime's
``GOMP_parallel`` is found (:func:`team_addresses`), a launch opens its
parallel region there instead (:mod:`cso.macrokernel.team`), which sets no
count.  A one-thread call needs none of it: its loop nest runs as one
worker on the calling thread, with no parallel region
(:mod:`cso.macrokernel.workers`).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

_runtimes = []  # [[(omp_get_max_threads, omp_set_num_threads), ...]], once looked up


def _functions() -> list:
    """The OpenMP runtimes to keep: the one the process's global symbols name
    (the one torch sets, when torch is loaded) and the one the symbols
    looked up through Numba's OpenMP pool library name, where they differ.
    Which one the pool runs on depends on the load order: with torch
    imported first the pool binds to torch's ``libgomp.so.1`` (the same
    soname), while the lookup through the pool library finds the system's
    (``LD_DEBUG=bindings``, torch 2.13, Numba 0.68); keeping both is right
    either way."""
    if not _runtimes:
        found, seen = [], set()
        for opener in (_global_library, _pool_library):
            try:
                library = opener()
                get, set_ = library.omp_get_max_threads, library.omp_set_num_threads
            except (ImportError, OSError, AttributeError):
                continue  # no OpenMP runtime this way
            address = ctypes.cast(get, ctypes.c_void_p).value
            if address in seen:
                continue
            seen.add(address)
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            found.append((get, set_))
        _runtimes.append(found)
    return _runtimes[0]


def _global_library():
    return ctypes.CDLL(None)


def _pool_library():
    from numba.np.ufunc import omppool

    return ctypes.CDLL(omppool.__file__)


def openmp_threads() -> list:
    """The calling thread's OpenMP thread count (``omp_get_max_threads``) in
    each runtime :func:`_functions` finds (an empty list where there is none)."""
    return [get() for get, _ in _functions()]


_addresses = []  # [runtime_addresses()], once built


def runtime_addresses() -> np.ndarray:
    """The addresses of each runtime's ``omp_get_max_threads`` and
    ``omp_set_num_threads`` (:func:`_functions`), two by two, as int64: for
    compiled code that keeps the counts around a parallel launch
    (:func:`cso.macrokernel.workers.launch_workers`; an empty array where
    there is no runtime)."""
    if not _addresses:
        pairs = [
            ctypes.cast(function, ctypes.c_void_p).value
            for pair in _functions()
            for function in pair
        ]
        _addresses.append(np.array(pairs, dtype=np.int64))
    return _addresses[0]


_launch = []  # [launch_addresses()], once built


def numba_count_addresses() -> list:
    """The addresses of Numba's getter and setter of the calling thread's
    count (the C functions behind ``numba.get_num_threads`` and
    ``numba.set_num_threads``, without their Python checks), or ``[0, 0]``
    where this Numba keeps none or its getter disagrees with the public
    function.  Starts Numba's thread pool (its first query does), keeping
    the OpenMP counts."""
    import numba
    from numba.np.ufunc import parallel

    with kept_openmp_threads():
        count = numba.get_num_threads()
    functions = (getattr(parallel, "_get_num_threads", None),
                 getattr(parallel, "_set_num_threads", None))  # fmt: skip
    try:
        addresses = [ctypes.cast(function, ctypes.c_void_p).value for function in functions]
        agrees = functions[0]() == count
    except (ctypes.ArgumentError, TypeError):  # not ctypes functions
        return [0, 0]
    return addresses if agrees and all(addresses) else [0, 0]


def team_addresses() -> list:
    """The addresses of ``GOMP_parallel``, ``omp_get_thread_num`` and
    ``omp_get_num_threads`` of the first runtime :func:`_functions` finds
    (the one torch runs on, when torch is loaded), for a parallel region
    opened from compiled code (:func:`cso.macrokernel.team.run_team`); or
    ``[0, 0, 0]`` where Numba's threading layer is not OpenMP (another pool
    of threads beside its own would compete with it for the cores), where no
    runtime exports them, or in a process forked from one that had looked
    them up (GNU OpenMP's threads do not survive a fork: Numba's own launch,
    which then takes over, stops such a process with a message).  Starts
    Numba's thread pool."""
    import numba

    none = [0] * len(TEAM_FUNCTIONS)
    try:
        numba.get_num_threads()  # starts the pool: the layer is known from then on
        if numba.threading_layer() != "omp" or _forked:
            return none
    except (ValueError, RuntimeError):
        return none
    for opener in (_global_library, _pool_library):
        try:
            library = opener()
            return [
                ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                for name in TEAM_FUNCTIONS
            ]
        except (ImportError, OSError, AttributeError):
            continue
    return none


# The slots of launch_addresses(): Numba's count getter and setter, the team's
# functions, then each runtime's pair.
TEAM_FUNCTIONS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
TEAM_SLOT = 2
RUNTIME_SLOTS = TEAM_SLOT + len(TEAM_FUNCTIONS)
_forked = False


def _after_fork_in_child() -> None:
    """A forked child launches through Numba's loop, which checks for the fork."""
    global _forked
    _forked = True
    if _launch:
        _launch[0][TEAM_SLOT:RUNTIME_SLOTS] = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def launch_addresses() -> np.ndarray:
    """What a parallel launch needs and keeps
    (:func:`cso.macrokernel.workers.launch_workers`), as int64 addresses:
    Numba's count getter and setter (:func:`numba_count_addresses`),
    :func:`team_addresses`, then :func:`runtime_addresses`.  One array,
    shared by every launch (a fork clears the team's slots in place)."""
    if not _launch:
        numba_pair = np.array(numba_count_addresses(), np.int64)
        team = np.array(team_addresses(), np.int64)
        _launch.append(np.concatenate((numba_pair, team, runtime_addresses())))
    return _launch[0]


def current_counts() -> list:
    """:func:`openmp_threads`, for :func:`restore_counts` (the runtimes found once)."""
    runtimes = _runtimes[0] if _runtimes else _functions()
    return [get() for get, _ in runtimes]


def restore_counts(counts: list) -> None:
    """Set each runtime's count back to ``counts`` (:func:`current_counts`) where it changed."""
    for (get, set_), count in zip(_runtimes[0], counts):
        if get() != count:
            set_(count)


class kept_openmp_threads:
    """Run the enclosed code, then set each OpenMP thread count back if it changed."""

    __slots__ = ("before",)

    def __enter__(self):
        self.before = current_counts()

    def __exit__(self, *exception):
        restore_counts(self.before)
        return False
