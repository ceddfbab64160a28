"""Winograd F(2x2, 3x3)'s transformed filters ``U = G g G^T``, packed ahead of time.

Packed-layout contract (what :mod:`cso.macrokernel.winograd` reads)
------------------------------------------------------------------
1-D, 16 planes of ``u_stride`` elements
(:func:`cso.analysis.winograd.workspace_elements`): plane ``e = 4*i + j``
holds ``U[i][j]`` of filter ``k`` and input channel ``c`` at ``k*C + c``,
zero for the filters past ``K`` up to ``K_pad`` (whole filter tiles) and in
each plane's padding.  The same layout the nest writes into its workspace
when it transforms the filters in the call, by the same operations in the
same order (:func:`cso.microkernels.winograd_transforms.build_filter_tiles`:
every sum rounded to the dtype, each halving exact), so a call with these
panels gives the same bits as one that transforms its filters itself.
"""

from __future__ import annotations

import numpy as np

from ..analysis.winograd import filter_plane_stride
from ..analysis.winograd_rules import POSITIONS
from .filters import aligned_empty


def transformed_elements(w_shape, filters_per_tile: int, dtype) -> tuple:
    """``(u_stride, elements)``: a plane's stride (the nest's own,
    :func:`~cso.analysis.winograd.filter_plane_stride`) and the packed array's size."""
    stride = filter_plane_stride(w_shape[0], w_shape[1], filters_per_tile, np.dtype(dtype).itemsize)
    return stride, POSITIONS * stride


def _g_times(a0, a1, a2, half):
    """``G (a0, a1, a2)``: the four rows, in the kernel's order of operations."""
    ends = a0 + a2
    return a0, half * (ends + a1), half * (ends - a1), a2


def pack_winograd_filters(w, filters_per_tile: int, dtype) -> np.ndarray:
    """``w`` (``(K, C, 3, 3)``) transformed into the packed layout above,
    64-byte aligned, in ``dtype``."""
    dtype = np.dtype(dtype)
    w = np.asarray(w).astype(dtype, copy=False)
    filters, channels = w.shape[0], w.shape[1]
    u_stride, elements = transformed_elements(w.shape, filters_per_tile, dtype)
    packed = aligned_empty(elements, dtype)
    packed[:] = 0
    half = dtype.type(0.5)
    # G g: each of the three columns j down its rows.
    columns = [_g_times(w[:, :, 0, j], w[:, :, 1, j], w[:, :, 2, j], half) for j in range(3)]
    for i in range(4):
        # (G g) G^T along row i.
        values = _g_times(columns[0][i], columns[1][i], columns[2][i], half)
        for j, value in enumerate(values):
            start = (4 * i + j) * u_stride
            packed[start : start + filters * channels] = value.reshape(-1)
    return packed
