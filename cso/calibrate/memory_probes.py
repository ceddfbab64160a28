"""Probes of the memory system: streaming bandwidth from L3 and DRAM, one
core alone and every core at once, and the first-level TLB miss penalty."""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from .timing import best_seconds


@njit(nogil=True, fastmath=True)
def _stream_sum(buffer, passes):
    # A vectorised reduction: the loads, not the adds, bound it.
    total = np.float32(0.0)
    for _ in range(passes):
        for i in range(buffer.size):
            total += buffer[i]
    return total


def _buffer(size_bytes: int) -> np.ndarray:
    buffer = np.empty(size_bytes // 4, np.float32)
    buffer[:] = 1.0
    return buffer


def read_bandwidth(size_bytes: int, repeats: int = 5, passes: int = 1) -> float:
    """Bytes per second one core reads, summing a buffer of ``size_bytes``
    (warmed by one untimed pass: it stays in whichever level holds it)."""
    buffer = _buffer(size_bytes)
    seconds = best_seconds(lambda: _stream_sum(buffer, passes), repeats)
    return size_bytes * passes / seconds


def shared_read_bandwidth(size_bytes: int, threads: int, repeats: int = 5) -> float:
    """Bytes per second per core with ``threads`` cores each summing its own
    buffer of ``size_bytes`` at once (the slowest thread's figure)."""
    if threads <= 1:
        return read_bandwidth(size_bytes, repeats)
    buffers = [_buffer(size_bytes) for _ in range(threads)]
    _stream_sum(buffers[0], 1)
    best = float("inf")
    for _ in range(repeats + 1):
        barrier = threading.Barrier(threads + 1)
        times = [0.0] * threads

        def work(index):
            import time

            barrier.wait()
            start = time.perf_counter()
            _stream_sum(buffers[index], 1)
            times[index] = time.perf_counter() - start

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        barrier.wait()
        for worker in workers:
            worker.join()
        best = min(best, max(times))
    return size_bytes / best


@njit(nogil=True)
def _chase(next_index, steps):
    index = 0
    for _ in range(steps):
        index = next_index[index]
    return index


def _chain(slots: np.ndarray, seed: int) -> np.ndarray:
    """A next-index array visiting ``slots`` (element indices) in a random cycle."""
    order = np.random.default_rng(seed).permutation(slots.size)
    size = int(slots.max()) + 1
    next_index = np.zeros(size, np.intp)
    cycle = slots[order]
    next_index[cycle] = np.roll(cycle, -1)
    return next_index, int(cycle[0])


def tlb_miss_seconds(page_bytes: int, line_bytes: int, tlb_entries: int, repeats: int = 5):
    """Extra seconds per load that misses the first-level data TLB.

    Two random dependent chases over the same number of lines, ``8 *
    tlb_entries`` of them: one line per page (every load on another page than
    the TLB holds), against consecutive lines (a few pages).  Each line of the
    paged chase sits at a different offset in its page, so both chases spread
    over the cache sets alike and stay in L1/L2; the difference is the TLB.
    """
    count = 8 * tlb_entries
    words_per_line = line_bytes // np.dtype(np.intp).itemsize
    words_per_page = page_bytes // np.dtype(np.intp).itemsize
    lines_per_page = page_bytes // line_bytes
    paged = np.array(
        [i * words_per_page + (i % lines_per_page) * words_per_line for i in range(count)]
    )
    packed = np.arange(count) * words_per_line
    steps = 200_000
    timings = []
    for slots in (paged, packed):
        next_index, _ = _chain(slots, 0)
        timings.append(best_seconds(lambda: _chase(next_index, steps), repeats) / steps)
    return max(0.0, timings[0] - timings[1])


def bandwidth_probes(cores: int, l3_size: int, dram_size: int, repeats: int) -> dict:
    """``{rate name: probe}``: the streaming read bandwidths the calibration
    keeps (:class:`~cso.analysis.rates.MeasuredRates`), from a buffer of
    ``l3_size`` bytes a core (in L3) and of ``dram_size`` (beyond it), one
    core alone and ``cores`` at once."""
    return {
        "l3_bytes_per_second": lambda: read_bandwidth(l3_size, repeats, passes=4),
        "dram_bytes_per_second": lambda: read_bandwidth(dram_size, max(2, repeats // 2)),
        "l3_shared_bytes_per_second": lambda: shared_read_bandwidth(l3_size, cores, repeats),
        "dram_shared_bytes_per_second": lambda: shared_read_bandwidth(
            dram_size, cores, max(2, repeats // 2)
        ),
    }
