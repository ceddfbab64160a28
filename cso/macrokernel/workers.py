"""Running a loop nest on its workers: one launch every nest shares.

Every loop nest (:mod:`.loops`, :mod:`.depthwise`, :mod:`.lanes`,
:mod:`.planes`, :mod:`.rows`) is compiled as a plain function of
``(worker, *arguments)`` that does worker ``worker``'s share of the work
(worker ``i`` of ``W`` takes jobs ``[i*J//W, (i+1)*J//W)``, the ``W`` of the
plan's threads).  A one-thread plan calls it as worker 0 on the calling
thread (:func:`serial_nest`): no parallel region, no OpenMP state touched.
A plan of more threads opens one parallel region whose threads call
worker ``i`` through the nest's address (:func:`launch_workers`,
:class:`ParallelNest`): straight through the OpenMP runtime (:mod:`.team`)
where one is found, else through Numba's parallel loop (:func:`run_workers`).

Why by address: a parallel loop that called the nest by name would link the
nest's code into its own and compile it again (Numba re-optimises a callee in
every library that links it), and a nest compiled with its own parallel loop
took twice its serial twin's compile time (a dense nest 13-15 s against 6 on
a Zen 3).  Called by address, the one launch is compiled once a machine for
each argument list (a family and a dtype), and a specialisation is one
compiled nest, whatever the thread count.

Contract: ``arguments`` is what :func:`cso.executor.loop_arguments` builds,
every array one-dimensional and C-contiguous (:mod:`.calling`).  The address
is that of the nest compiled for the arguments' types with every array
writable and aligned (:func:`nest_signature`): arrays that differ only in
those flags have the same machine representation, so one compiled nest
serves a read-only input too.

Thread settings: the team's region sets no thread count (``num_threads`` is
a clause of the region, not a setting).  Numba's OpenMP layer, the
fallback, sets the calling thread's OpenMP thread count as it launches
(:mod:`cso.openmp`): :func:`launch_workers` then keeps each runtime's count
around :func:`run_workers` in compiled code, reading and setting it through
the addresses :func:`cso.openmp.launch_addresses` gives (an argument: a
function that embeds an address is not cached), where Python took four
calls through ctypes a launch; and it raises Numba's own count to the
plan's workers for the launch where it is lower, through Numba's C getter
and setter (a query from Python before every launch cost 4.4 microseconds
a call in the benchmark's rounds: a Xeon, EfficientNet-B0's depthwise calls
at two threads, ``experiments/call_steps.py``).  Not in :func:`run_workers`
itself: a parallel function sets the count as it is entered, before
anything in it could read it.
"""

from __future__ import annotations

import functools
import sys
import threading

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic
from llvmlite import ir

from ..numba_cache import guard_module
from ..openmp import RUNTIME_SLOTS, TEAM_SLOT, kept_openmp_threads, launch_addresses
from .calling import call_worker, canonical_type
from .team import run_team


# Every family's nest takes eleven arguments after the worker's index
# (cso.executor.nest_arguments), and the parallel loop names each: a tuple
# holding arrays must not cross into a parallel loop's body (Numba's parallel
# lowering dropped the writes made through one, silently, in a small test).


@njit(nogil=True, parallel=True, cache=True)
def run_workers(address, workers, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    """Workers ``0 .. workers-1`` of the nest at ``address``, in parallel."""
    for worker in prange(workers):
        call_worker(address, np.int64(worker), a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)


@intrinsic
def openmp_count(typingctx, getter):
    """``omp_get_max_threads()`` of the runtime whose function is at ``getter``."""

    def codegen(context, builder, signature, values):
        function_type = ir.FunctionType(ir.IntType(32), [])
        function = builder.inttoptr(values[0], function_type.as_pointer())
        return builder.sext(builder.call(function, []), ir.IntType(64))

    return types.int64(types.int64), codegen


@intrinsic
def set_openmp_count(typingctx, setter, count):
    """``omp_set_num_threads(count)`` of the runtime whose function is at ``setter``."""

    def codegen(context, builder, signature, values):
        function_type = ir.FunctionType(ir.VoidType(), [ir.IntType(32)])
        function = builder.inttoptr(values[0], function_type.as_pointer())
        builder.call(function, [builder.trunc(values[1], ir.IntType(32))])
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


@njit(nogil=True, cache=True)
def launch_workers(address, workers, counts, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    """Workers ``0 .. workers-1`` of the nest at ``address`` on ``workers``
    threads, every thread count the launch touches left as it was
    (``counts``, :func:`cso.openmp.launch_addresses`).

    Where ``counts[2]`` is not 0 (an OpenMP runtime's ``GOMP_parallel``,
    with ``counts[3]`` and ``counts[4]`` its ``omp_get_thread_num`` and
    ``omp_get_num_threads``: :func:`cso.openmp.team_addresses`), one
    parallel region opened there (:func:`cso.macrokernel.team.run_team`), which sets no
    count.  Otherwise :func:`run_workers`, Numba's parallel loop:
    ``counts[0]`` and ``counts[1]``, Numba's getter and setter of the calling
    thread's count (0 where this Numba keeps none; the caller then raises
    the count itself), raise it to ``workers`` for the launch where it is
    lower (a parallel loop of more iterations than threads runs them in
    turn) and set it back after; ``counts[5 + 2i]`` and ``counts[6 + 2i]``,
    each OpenMP runtime's ``omp_get_max_threads`` and
    ``omp_set_num_threads``, set it back after the launch where it changed.
    """
    if counts[TEAM_SLOT] != 0:
        run_team(counts[TEAM_SLOT], counts[TEAM_SLOT + 1], counts[TEAM_SLOT + 2], address, workers,
                 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)  # fmt: skip
        return
    numba_count = workers
    if counts[0] != 0:
        numba_count = openmp_count(counts[0])
        if numba_count < workers:
            set_openmp_count(counts[1], workers)
    kept = np.empty((counts.size - RUNTIME_SLOTS) // 2, np.int64)
    for runtime in range(kept.size):
        kept[runtime] = openmp_count(counts[RUNTIME_SLOTS + 2 * runtime])
    run_workers(address, workers, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
    if numba_count < workers:
        set_openmp_count(counts[1], numba_count)
    for runtime in range(kept.size):
        if openmp_count(counts[RUNTIME_SLOTS + 2 * runtime]) != kept[runtime]:
            set_openmp_count(counts[RUNTIME_SLOTS + 1 + 2 * runtime], kept[runtime])


def nest_signature(arguments: tuple) -> tuple:
    """The types a nest is compiled for to be called on ``arguments``
    through :func:`run_workers`: the worker index, then each argument's
    :func:`canonical_type`."""
    return (types.int64,) + tuple(canonical_type(numba.typeof(a)) for a in arguments)


def nest_address(nest, arguments: tuple) -> int:
    """The address of ``nest`` (a Numba dispatcher) compiled for
    :func:`nest_signature` of ``arguments``, compiling it (or loading it from
    the disk cache) first."""
    signature = nest_signature(arguments)
    nest.compile(signature)
    result = nest.overloads[signature]
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


def serial_nest(nest):
    """A one-thread plan's nest: worker 0 of 1, on the calling thread (a
    ``functools.partial``, whose call costs less than a method's)."""
    return functools.partial(nest, 0)


class ParallelNest:
    """A plan's nest on ``workers`` workers through :func:`launch_workers`;
    the nest's address is found at the first call (its arguments' types are
    the plan's from then on: :func:`cso.executor.loop_arguments` makes them),
    and so are the thread counts a launch keeps (``counts``,
    :func:`cso.openmp.launch_addresses`)."""

    __slots__ = ("nest", "workers", "address", "dtype", "counts", "counted")

    def __init__(self, nest, workers: int):
        self.nest = nest
        self.workers = int(workers)
        self.address = 0
        self.dtype = None
        self.counts = None
        # Whether the launch needs no count from Python: it opens its own
        # parallel region (the team's functions found), or raises Numba's
        # count itself (Numba's C getter found).
        self.counted = False

    def __call__(self, *arguments):
        dtype = arguments[0].dtype
        if dtype is not self.dtype:  # (not !=: NumPy takes None for float64)
            # The first call; the rest of a launch's calls have its plan's
            # dtype, and then the same types (nest_arguments makes them).
            # Compiling or loading the nest and launch_workers for them starts
            # Numba's thread pool, which sets the OpenMP count before compiled
            # code could read it: this call keeps the count from Python.
            with kept_openmp_threads():
                self.counts = launch_addresses()
                self.counted = bool(self.counts[0] or self.counts[TEAM_SLOT])
                self.address = nest_address(self.nest, arguments)
                launch_workers(self.address, self.workers, self.counts, *arguments)
            self.dtype = dtype
            return
        launch_workers(self.address, self.workers, self.counts, *arguments)


@njit(nogil=True, inline="always")
def launch_any(address, workers, counts, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    """:func:`launch_workers`, or with one worker the nest at ``address`` as
    worker 0 on the calling thread (no parallel region, ``counts`` unread)."""
    if workers == 1:
        call_worker(address, np.int64(0), a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
    else:
        launch_workers(address, workers, counts, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)


@njit(nogil=True, cache=True)
def launch_typed(address, workers, counts, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    """:func:`launch_any`: the launch of :func:`typed_launch`, compiled only
    for the types it is given."""
    launch_any(address, workers, counts, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)


# launch_typed is handed out only by typed_launch, which compiles it for the
# types it is given and then refuses others (Numba disables compilation only
# once a function has a signature, so not from import on).
_typed_lock = threading.Lock()


def typed_launch(arguments: tuple):
    """:func:`launch_typed`, compiled (or loaded from the disk cache) for the
    types of ``arguments`` (its own, the address, workers and counts first),
    and refusing any other (:func:`compiled_only_for`).  What that buys: no
    Python check of each operand's flags before a launch, 1-2 microseconds a
    call in the benchmark's rounds (a Xeon, two threads,
    ``experiments/call_steps.py``'s way of timing)."""
    return compiled_only_for(launch_typed, arguments)


def compiled_only_for(dispatcher, arguments: tuple):
    """``dispatcher`` (a Numba function compiled only through here),
    compiled (or loaded from the disk cache) for the types of ``arguments``
    and refusing any other: a call whose arguments' types differ (an
    operand read-only, unaligned or strided) raises ``TypeError`` before any
    work instead of compiling it for them, so that its caller can take a
    path that converts such operands."""
    signature = tuple(numba.typeof(argument) for argument in arguments)
    with _typed_lock:
        if signature not in dispatcher.overloads:
            dispatcher.disable_compile(False)
            try:
                with kept_openmp_threads():
                    dispatcher.compile(signature)
            finally:
                dispatcher.disable_compile(True)
    return dispatcher


# Every cached function here compiles for several argument types, in
# whichever processes come first (cso.numba_cache).
guard_module(sys.modules[__name__])
