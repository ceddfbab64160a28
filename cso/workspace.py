"""Scratch memory for the loop nests, kept from one call to the next.

The loop nests need, per worker, room for the input panels they pack and
one edge tile of output.  Allocating that afresh in every call is what
makes a call slow, not the allocation itself: a buffer of more than about
128 KiB comes from ``mmap``, and the first touch of each of its pages
faults.  Measured here on ResNet-50's ``1x1 64->64 @56`` (800 KiB of
panels): 0.74 ms a call with fresh panels, 0.31 ms with reused ones.  So
each Python thread keeps one buffer, grown when a call needs more, and
every call on that thread reuses it.  Threads do not share buffers, so
concurrent calls from several Python threads stay independent.  Filters
packed in a call for a filter-vectorised kernel have a kept buffer of
their own (``role="filters"``): the filter packing of ``3x3 512->512 @14``
(9.4 MiB) measured 87 to 150 units an element from one process to the next
with fresh panels, as the allocator did or did not hand back touched pages.

Besides the kept buffers, :func:`placeholder` hands out shared arrays of
zeros for operands the nests never write.

The buffer is zeroed when allocated and afterwards holds only values the
loop nests wrote, so it never feeds NaN or subnormal garbage to a kernel.
"""

from __future__ import annotations

import threading

import numpy as np

from .packing.filters import ALIGN_BYTES, aligned_empty

# Beyond this, a buffer is not kept: one unusual call should not pin that
# much memory to a thread for the rest of the process.
KEEP_LIMIT_BYTES = 64 << 20

_local = threading.local()


def worker_stride(elements: int, dtype) -> int:
    """Elements from one worker's part of the workspace to the next.

    ``elements`` rounded up to whole 64-byte lines, so that every worker's
    panels start on a line boundary, as the micro-kernels' vector loads want.
    """
    per_line = ALIGN_BYTES // np.dtype(dtype).itemsize
    return -(-elements // per_line) * per_line


def workspace(elements: int, dtype, role: str = "loops") -> np.ndarray:
    """A 64-byte aligned 1-D scratch array of ``elements`` ``dtype`` values.

    The calling thread's kept buffer for ``role`` (grown if too small), so
    consecutive calls touch memory that is already mapped.  Its contents
    are whatever the last call left there (finite: see the module
    docstring).  One call may hold one buffer of each role at once.
    """
    dtype = np.dtype(dtype)
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    key = (dtype, role)
    buffer = buffers.get(key)
    if buffer is None or buffer.size < elements:
        buffer = aligned_empty(max(elements, 1), dtype)
        buffer[:] = 0
        if buffer.nbytes <= KEEP_LIMIT_BYTES:
            buffers[key] = buffer
    return buffer[:elements]


def release() -> None:
    """Drop the calling thread's kept workspace buffers (the next call allocates anew)."""
    _local.buffers = {}


_placeholders: dict = {}


def placeholder(size: int, dtype) -> np.ndarray:
    """A shared array of ``size`` zeros, for an operand the loop nests never
    write: one whose values they never use (the row and plane nests')."""
    key = (size, np.dtype(dtype))
    array = _placeholders.get(key)
    if array is None:
        array = _placeholders[key] = np.zeros(size, dtype)
    return array
