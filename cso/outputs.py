"""The output arrays cso allocates for its callers.

A convolution's output is returned to the caller, so it is fresh memory
each call (unlike the loop nests' kept scratch, :mod:`cso.workspace`); it
starts on a cache line because the kernels store whole vectors along its
rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .packing.filters import ALIGN_BYTES


@njit(nogil=True, cache=True)
def _line_offset(array):
    """Bytes from the cache line's start to ``array``'s data (``.ctypes`` in
    Python took 0.8 us, this 0.2)."""
    return array.ctypes.data % ALIGN_BYTES


def new_output(shape, dtype) -> np.ndarray:
    """A fresh, uninitialised C-contiguous array of ``shape`` whose data starts
    on a 64-byte boundary: the kernels store whole vectors along the output's
    rows, and one that starts off a line boundary splits each store across two
    lines (on a Xeon, ``dw 3x3 32 @112`` ran 148 us into an aligned output and
    177-197 us into NumPy's 16-byte aligned ones, side by side).  It is a view
    of a buffer at most a line longer; NumPy's allocations are aligned to
    the element, so whole elements are skipped."""
    dtype = np.dtype(dtype)
    size = 1
    for extent in shape:
        size *= int(extent)
    raw = np.empty(size + ALIGN_BYTES // dtype.itemsize, dtype)
    skip = (ALIGN_BYTES - _line_offset(raw)) % ALIGN_BYTES // dtype.itemsize
    return raw[skip : skip + size].reshape(shape)
