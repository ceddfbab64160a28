"""Filter packing: KCRS filters into the micro-kernel's filter panels.

Packed-layout contract
----------------------
``packed`` is 1-D, laid out as ``[G][T_f][C_g*R*S][Nf]`` with
``T_f = ceil(K_g / Nf)``: for group ``g`` and filter tile ``f``, row
``k = (c*R + r)*S + s`` holds element ``k`` of filters ``f*Nf .. f*Nf+Nf-1``
side by side.  Filters beyond ``K_g`` are zero, so the last tile is full.

Dot-product kernels (a fully connected layer as a convolution) read each
filter as a contiguous row instead: their "panels" are the KCRS array as it
is (:func:`pack_filters_rows`, an aligned copy).  Filters read in place
need a packed tile only for groups of fewer than ``Nf`` filters
(:func:`pack_edge_filters`, :func:`pack_edge_filter_rows`); a larger group's
last, partial tile is read as the ``Nf`` rows that end at ``K_g``.

Because the reduction index runs over channels outermost, the panel of any
channel tile ``[c0, c0 + Nc)`` is the contiguous run of rows starting at
``c0*R*S``: its offset is :func:`filter_panel_offset`, and the packing does
not depend on the channel tile at all, only on ``Nf``.

``bias`` is packed the same way, ``[G][T_f*Nf]``, zero beyond ``K_g``.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit
from numba.extending import register_jitable

from ..geometry import ceil_div
from ..numba_cache import guard_module
from .transpose import transpose_into_panels, transpose_into_panels_serial, vector_token


ALIGN_BYTES = 64


@njit(nogil=True, cache=True)
def _line_offset(array):
    """Bytes from the cache line's start to ``array``'s data (``.ctypes`` in
    Python took 0.8 us, this 0.2: every ``cso.conv2d`` output is allocated
    by :func:`aligned_empty`)."""
    return array.ctypes.data % ALIGN_BYTES


def aligned_empty(size: int, dtype) -> np.ndarray:
    """An uninitialised 1-D array whose data starts on a 64-byte boundary.

    A filter-vectorised micro-kernel loads each panel row (``Nf`` elements,
    a multiple of 64 bytes) as vectors; from an address off a cache-line
    boundary every such load is split across two lines (NumPy's own
    allocations are only 16-byte aligned).
    """
    dtype = np.dtype(dtype)
    # A buffer of the dtype itself, not bytes viewed as it, costs a third of
    # a microsecond less a call.
    return aligned_part(np.empty(size + ALIGN_BYTES // dtype.itemsize, dtype), size)


@register_jitable
def aligned_part(raw, size):
    """The ``size`` elements of ``raw`` (a 1-D array of ``size`` elements and
    a cache line's more) from its first element on a 64-byte boundary: NumPy
    aligns its allocations to the element, so whole elements are skipped.
    Python's and compiled code's (:func:`cso.quick_launch.launch_kcrs`)."""
    skip = (ALIGN_BYTES - _line_offset(raw)) % ALIGN_BYTES // raw.itemsize
    return raw[skip : skip + size]


def is_aligned(array: np.ndarray) -> bool:
    """Whether ``array``'s data starts on a 64-byte boundary."""
    return array.ctypes.data % ALIGN_BYTES == 0


def pack_filters_panels(
    w: np.ndarray, groups: int, filters_per_tile: int, dtype, vector_lanes: int, scratch=None,
    parallel: bool = True,
) -> np.ndarray:  # fmt: skip
    """Pack ``w[K][C_g][R][S]`` into ``[G][T_f][C_g*R*S][Nf]`` (flattened), zero-padded,
    transposing blocks of ``vector_lanes`` (the plan's vector width).

    ``scratch``, when given, is ``scratch(elements)``: a 64-byte aligned
    array of at least that many ``dtype`` elements to pack into (a call's
    kept buffer); else the panels get an array of their own.  ``parallel``
    False packs on the calling thread alone, with no parallel region
    (:func:`~cso.packing.transpose.transpose_into_panels_serial`)."""
    filters, channels_per_group, height, width = w.shape
    filters_per_group = filters // groups
    tiles = ceil_div(filters_per_group, filters_per_tile)
    reduction = channels_per_group * height * width
    source = np.ascontiguousarray(w, dtype=dtype).reshape(-1)
    elements = groups * tiles * reduction * filters_per_tile
    packed = aligned_empty(elements, dtype) if scratch is None else scratch(elements)[:elements]
    transpose = transpose_into_panels if parallel else transpose_into_panels_serial
    transpose(
        source,
        groups,
        filters_per_group,
        reduction,
        filters_per_tile,
        tiles,
        packed,
        vector_token(vector_lanes),
    )
    return packed


def _last_tile_rows(w_flat, groups, filters_per_group, reduction, filters_per_tile):
    """``[G][Nf][C_g*R*S]``: each group's last, partial filter tile, zero rows
    past ``K_g``; None when ``Nf`` divides ``K_g``."""
    full = filters_per_group // filters_per_tile
    remainder = filters_per_group - full * filters_per_tile
    if remainder == 0:
        return None
    by_group = w_flat.reshape(groups, filters_per_group, reduction)
    tile = np.zeros((groups, filters_per_tile, reduction), dtype=w_flat.dtype)
    tile[:, :remainder] = by_group[:, full * filters_per_tile :]
    return tile


def pack_edge_filters(
    w_flat: np.ndarray, groups: int, filters_per_group: int, reduction: int, filters_per_tile: int
) -> np.ndarray:
    """The last, partial filter tile of each group as panels ``[G][C_g*R*S][Nf]``.

    For filters read in place (strides ``(1, C_g*R*S)``) in groups of fewer
    than ``Nf`` filters: the tile's rows past ``K_g`` must be zeros, not the
    next group's filters or memory past the array.  Empty when ``Nf``
    divides ``K_g``.
    """
    tile = _last_tile_rows(w_flat, groups, filters_per_group, reduction, filters_per_tile)
    if tile is None:
        return np.zeros(filters_per_tile, dtype=w_flat.dtype)
    return np.ascontiguousarray(tile.transpose(0, 2, 1)).reshape(-1)


def pack_filters_rows(w: np.ndarray, dtype) -> np.ndarray:
    """``w`` flattened as KCRS rows, in ``dtype``, on a cache line (the
    "panels" of a dot-product plan packed ahead of time)."""
    source = np.ascontiguousarray(w, dtype=dtype).reshape(-1)
    rows = aligned_empty(source.size, dtype)
    rows[:] = source
    return rows


def pack_edge_filter_rows(
    w_flat: np.ndarray, groups: int, filters_per_group: int, reduction: int, filters_per_tile: int
) -> np.ndarray:
    """The last, partial filter tile of each group as rows ``[G][Nf][C_g*R*S]``.

    For dot-product kernels, which read every filter as a contiguous row:
    the full tiles are the KCRS rows themselves, and this tile holds the
    remaining ``K_g % Nf`` rows followed by zero rows.
    """
    tile = _last_tile_rows(w_flat, groups, filters_per_group, reduction, filters_per_tile)
    if tile is None:
        return np.zeros(filters_per_tile, dtype=w_flat.dtype)
    return tile.reshape(-1)


def padded_filters_per_group(filters: int, groups: int, filters_per_tile: int) -> int:
    """``T_f * Nf``: a group's filters rounded up to whole filter tiles."""
    return ceil_div(filters // groups, filters_per_tile) * filters_per_tile


def pack_bias(bias, filters: int, groups: int, filters_per_tile: int, dtype) -> np.ndarray:
    """Pack ``bias[K]`` (or zeros when ``None``) as ``[G][T_f*Nf]`` (flattened)."""
    filters_per_group = filters // groups
    padded_filters = padded_filters_per_group(filters, groups, filters_per_tile)
    packed = np.zeros((groups, padded_filters), dtype=dtype)
    if bias is not None:
        packed[:, :filters_per_group] = np.asarray(bias).reshape(groups, filters_per_group)
    return packed.reshape(-1)


@register_jitable
def filter_panel_offset(
    group: int,
    filter_tile: int,
    channel_start: int,
    filter_tiles: int,
    reduction: int,
    kernel_area: int,
    filters_per_tile: int,
) -> int:
    """Element offset of the panel for (group, filter tile, channel tile start)."""
    return (
        (group * filter_tiles + filter_tile) * reduction + channel_start * kernel_area
    ) * filters_per_tile


# Every cached function here compiles for several argument types, in
# whichever processes come first (cso.numba_cache).
guard_module(sys.modules[__name__])
