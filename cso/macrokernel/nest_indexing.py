"""Job and tile indexing of the dense loop nests (:mod:`cso.macrokernel.loops`).

Pure functions of the bounds (:class:`~cso.macrokernel.bounds.LoopBounds`)
and the workspace: the tile counts, which (group, image, block) a parallel
job is, each channel tile's range, whether a window tile is read in place,
each worker's buffers and their data addresses.  They hold no kernel and
no packing, so they live outside the template that binds those.
"""

import sys

from numba import njit

from ..numba_cache import guard_module


@njit(nogil=True, cache=True)
def tile_counts(b):
    """``(T_w, T_f, T_c)``: window, filter and channel tiles of one job's
    (group, window run)."""
    windows = b.window_images * b.out_height * b.out_width
    window_tiles = (windows + b.windows_per_tile - 1) // b.windows_per_tile
    filter_tiles = (b.filters + b.filters_per_tile - 1) // b.filters_per_tile
    channel_tiles = (b.channels + b.channel_tile - 1) // b.channel_tile
    return window_tiles, filter_tiles, channel_tiles


@njit(nogil=True, cache=True)
def job_of(b, job, blocks):
    """``(group, image, block)`` of parallel job number ``job``."""
    return job // (blocks * b.batch), (job // blocks) % b.batch, job % blocks


@njit(nogil=True, cache=True)
def channel_range(b, index, count):
    """Channels ``[start, start + size)`` of channel tile ``index`` of ``count``.

    The ``ceil(C / Nc)`` tiles split ``C`` evenly (sizes differ by at most
    one, none above ``Nc``), so no tile is a sliver with a depth too short
    to amortise the micro-kernel's write-back.
    """
    start = index * b.channels // count
    return start, (index + 1) * b.channels // count - start


@njit(nogil=True, cache=True)
def reads_in_place(b, window_start):
    """Whether this window tile is read from the input itself, unpacked:
    only a full tile inside one image's windows is a run of ``x``."""
    image_windows = b.out_height * b.out_width
    return b.input_in_place and window_start % image_windows + b.windows_per_tile <= image_windows


@njit(nogil=True, cache=True)
def worker_buffers(workspace, b, worker):
    """``(panels, scratch, filter_tile)``: worker ``worker``'s input panels,
    edge tile and filter tile.

    Worker ``i`` owns ``workspace[i*stride : (i+1)*stride]``: its panels
    from the start, its ``Nf x Nwin`` scratch tile from ``scratch_offset``,
    its ``Nc*R*S x Nf`` filter tile from ``filter_tile_offset`` (empty
    unless ``b.filters_in_nest``).
    """
    start = worker * b.workspace_stride
    panels = workspace[start : start + b.scratch_offset]
    scratch_start = start + b.scratch_offset
    scratch = workspace[scratch_start : scratch_start + b.filters_per_tile * b.windows_per_tile]
    tile_start = start + b.filter_tile_offset
    filter_tile = workspace[tile_start : start + b.workspace_stride]
    return panels, scratch, filter_tile


@njit(nogil=True, inline="always")
def operand_addresses(operands):
    """The data addresses of ``operands``' x, filters, edge filters, y,
    panels, scratch and filter tile, as the micro-kernel takes them (see
    the contract of :mod:`cso.macrokernel.loops`)."""
    x_flat, filters, edge_filters, _, y_flat, panels, scratch, _, filter_tile = operands
    return (
        x_flat.ctypes.data,
        filters.ctypes.data,
        edge_filters.ctypes.data,
        y_flat.ctypes.data,
        panels.ctypes.data,
        scratch.ctypes.data,
        filter_tile.ctypes.data,
    )


# Every cached function here compiles for several argument types, in
# whichever processes come first (cso.numba_cache).
guard_module(sys.modules[__name__])
