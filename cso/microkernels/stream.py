"""The memory ceiling: how fast this machine streams a layer's compulsory bytes.

A memory-bound layer (a depthwise convolution does ``R*S`` multiply-adds per
output element) cannot run faster than it takes to read its input and
filters once and write its output once.  :func:`stream_seconds` times
exactly that traffic on buffers of the same sizes, so the level that holds
them (L1, L2, the shared L3 or DRAM) is the one that would hold the layer's
operands in a warm, repeated call: the roofline the benchmark compares with.
"""

from __future__ import annotations

import sys
import time

import numba
import numpy as np

from ..numba_cache import guard_module
from ..openmp import kept_openmp_threads


@numba.njit(fastmath=True, nogil=True, cache=True)
def _stream_part(source, destination):
    # A vectorised reduction (fastmath: several accumulators) and a fill.  The
    # loops run over whole arrays (slices): with explicit start and stop
    # indices Numba's wraparound check kept LLVM from vectorising (7 against
    # 40-90 GB/s from L1 and L2 here).
    partial = np.float32(0.0)
    for index in range(source.size):
        partial += source[index]
    for index in range(destination.size):
        destination[index] = partial
    return partial


@numba.njit(parallel=True, nogil=True, cache=True)
def _stream_parallel(source, destination, parts):
    total = 0.0
    for part in numba.prange(parts):
        total += _stream_part(
            source[part * source.size // parts : (part + 1) * source.size // parts],
            destination[
                part * destination.size // parts : (part + 1) * destination.size // parts
            ],
        )
    return total


def stream_once(source, destination, parts: int):
    """Read ``source`` and write ``destination`` once (float32 arrays), in
    ``parts`` contiguous shares run in parallel on Numba's threads (one: on
    the calling thread, no parallel launch to pay)."""
    if parts == 1:
        return _stream_part(source, destination)
    return _stream_parallel(source, destination, parts)


def stream_buffers(read_bytes: int, written_bytes: int) -> tuple:
    """``(source, destination)``: float32 buffers of ``read_bytes`` and
    ``written_bytes`` for :func:`stream_once`."""
    source = np.ones(max(1, read_bytes // 4), np.float32)
    destination = np.empty(max(1, written_bytes // 4), np.float32)
    return source, destination


def stream_seconds(read_bytes: int, written_bytes: int, threads: int = 1,
                   rounds: int = 5, min_seconds: float = 0.05) -> float:
    """Best time to read ``read_bytes`` and write ``written_bytes`` of float32
    on ``threads`` threads (each a contiguous share), warm, best of ``rounds``.

    Each round repeats the stream until ``min_seconds`` have passed and takes
    the mean, so that tiny buffers are not timed by the clock's resolution.
    Numba's thread count and the process's OpenMP counts are left as they
    were (Numba's OpenMP layer sets the latter as it launches).
    """
    source, destination = stream_buffers(read_bytes, written_bytes)
    with kept_openmp_threads():
        return _best_stream(source, destination, threads, rounds, min_seconds)


def _best_stream(source, destination, threads, rounds, min_seconds) -> float:
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        stream_once(source, destination, threads)  # compile, and bring the buffers in
        best = float("inf")
        for _ in range(rounds):
            repeats, started = 0, time.perf_counter()
            while True:
                stream_once(source, destination, threads)
                repeats += 1
                elapsed = time.perf_counter() - started
                if elapsed >= min_seconds:
                    break
            best = min(best, elapsed / repeats)
    finally:
        numba.set_num_threads(previous)
    return best


# Every cached function here compiles for several argument types, in
# whichever processes come first (cso.numba_cache).
guard_module(sys.modules[__name__])
