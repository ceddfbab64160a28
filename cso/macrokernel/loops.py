"""The macro-kernel: the cache-tiling loop nests that drive the micro-kernel.

This file is a template as well as a module.  The global ``microkernel`` is
bound per specialisation (Nf, Nwin, dtype, vector lanes, orientation) by
:mod:`cso.macrokernel.specialise`, which writes this source plus one binding
line into its own file, so that every specialisation is a separate module
with its own on-disk Numba cache.  Only loops live here; the arithmetic is
in the micro-kernel, the data movement in :mod:`cso.packing` (a block of
window tiles packed by :mod:`cso.macrokernel.input_tiles`).

Contracts relied on
-------------------
* Filters, one of three ways (``b.filters_in_nest``, ``b.filters_packed``):

  - packed in the nest (WS only): ``filters`` is the KCRS array
    flattened; before filter tile ``f``'s kernel calls for channel tile
    ``c0`` the nest packs that tile's rows of ``c0`` into the worker's
    ``filter_tile``, ``[Nc*R*S][Nf]`` (zero filters past ``K_g``), which
    the kernel reads with strides ``(Nf, 1)``.  The plan takes this only
    where each tile is packed once a call (:attr:`Plan.packs_filters_in_nest`);

  - packed: ``filters`` is ``[G][T_f][C_g*R*S][Nf]`` as
    :mod:`cso.packing.filters` says (strides ``(Nf, 1)``);
  - in place: ``filters`` is the KCRS array flattened, read with strides
    ``(1, C_g*R*S)``.  A last, partial tile (``K_g % Nf``) reads the ``Nf``
    rows that end at ``K_g``, overlapping the tile before it, and keeps
    only its own rows of the result.  Only groups of fewer than ``Nf``
    filters have no such rows: then ``edge_filters`` holds each group's
    tile packed, ``[G][C_g*R*S][Nf]`` (zero rows past ``K_g``), or
    ``[G][Nf][C_g*R*S]`` (``b.edge_rows``) for dot-product kernels, which
    read every filter as a row.

  A filter-vectorised micro-kernel (``vector_operand="filters"``) loads
  vectors along ``Nf`` and is only bound to a module whose callers pass
  packed filters; a dot-product one (``"reduction"``) loads along the
  reduction and gets the filters in place.
* ``bias``: ``[G][T_f*Nf]``, zero past ``K_g``.
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded: packing
  writes the padding's zeros into the panels.  When
  ``b.input_in_place`` (1x1, stride 1, no padding, small planes: see the
  plan) a full window tile's
  panel *is* ``x_flat`` from ``image + c0*H*W + w0`` with row stride ``H*W``,
  and only edge tiles are packed into ``[nc*R*S][Nwin]`` panels.  When
  ``b.pack_channels_outer`` (the other 1x1, stride-1, unpadded plans) the
  tiles' panels are the same layout, packed a block at a time channel by
  channel (:func:`~cso.packing.inputs.pack_pointwise_panels`).  For a
  dot-product kernel the one window is the whole input (``P*Q = 1``,
  ``R = H``, ``S = W``): its elements are ``x_flat`` from ``image + c0*H*W``,
  contiguous.
* ``y_flat``: the output ``[N][K][P*Q]`` flattened; every element is
  written at the first channel tile and accumulated into after it.
* ``residual``: ``y_flat``'s layout (a placeholder never read unless
  ``has_residual``).  The epilogue, ``y = act(y + residual)`` with ``act``
  numbered by ``activation`` (0: none), is applied once per output, at the
  last channel tile: by the micro-kernel in registers for a full tile, by
  ``epilogue_run`` on the valid part of an edge tile once it is in ``y``.
* Windows: a job's window run is ``b.window_images`` images' ``P*Q``
  windows, image after image (``N`` when the plan folds the batch into
  the windows, and then ``b.batch`` is 1).  Window ``w`` of the run is
  window ``w % (P*Q)`` of image ``image + w // (P*Q)``.  A tile that holds
  windows of two images is an edge tile: packed (never read in place) and
  computed into ``scratch``, whose columns are then copied image by image.
* Work is split into jobs ``(group, image, stationary block)``, and for WS
  also window part, that own disjoint parts of ``y``, so the parallel loop
  needs no synchronisation.  A call of a nest is one worker's share
  (:mod:`cso.macrokernel.workers` runs the ``W`` workers, in parallel or
  as worker 0 alone): worker ``i`` of ``W`` takes jobs
  ``[i*J//W, (i+1)*J//W)`` in order.
* ``workspace``: ``W`` parts of ``b.workspace_stride`` elements, each
  64-byte aligned (:mod:`cso.workspace`): worker ``i``'s input panels from
  the start of its part, its ``Nf x Nwin`` edge-tile scratch from
  ``b.scratch_offset``.  The caller keeps it between calls, so the loop
  nests allocate nothing.
* ``bounds``: the :class:`~cso.macrokernel.bounds.LoopBounds` fields as a
  plain tuple, made a ``LoopBounds`` again inside (Numba types a plain
  tuple argument in C, a namedtuple in Python: 3.2 against 0.7
  microseconds a call).
* The micro-kernel gets ``filters``, ``inputs`` and ``out`` as the
  addresses of their arrays' data (``operand_addresses``, once per worker), not
  as arrays: ``_tile`` picks one of two for each per tile, and a choice
  between arrays makes Numba update both arrays' reference counts (atomic
  adds) on every tile, which cost a 1x1 layer of 24 channels 0.17 of its
  0.44 ms on an AMD EPYC (Zen 3).  The arrays are this call's arguments and
  outlive it.
"""

from numba import njit

from cso.macrokernel.bounds import LoopBounds
from cso.macrokernel.input_tiles import pack_window_tiles
from cso.macrokernel.nest_indexing import (
    channel_range,
    job_of,
    operand_addresses,
    reads_in_place,
    tile_counts,
    worker_buffers,
)
from cso.packing.filters import filter_panel_offset
from cso.packing.transpose import pack_filter_tile
from cso.packing.run_stores import copy_run

# Bound by cso.macrokernel.specialise in each generated specialisation: the
# micro-kernel, and the packing's vector token of the plan's width
# (cso.packing.transpose.vector_token; a global, so Numba freezes it).
microkernel = None
VECTOR_TOKEN = None
epilogue_run = None


@njit(nogil=True, cache=True)
def convolve_input_stationary(
    worker, x_flat, filters, edge_filters, bias, has_bias, residual, activation, has_residual,
    y_flat, workspace, bounds
):
    """IS: each job keeps ``K3`` packed input tiles and streams all filters.

    ::

        for worker                                              # parallel
         for job = (group, image*, window block of K3 tiles)   # the worker's share
          for c0 in ceil(C/Nc) even channel tiles (<= Nc each) # partial sums in y
            pack the block's K3 input tiles                     # ~ L3
            for f0 in blocks of K2 filter tiles                 # ~ L2
              for w in the K3 input tiles                       # one in L1
                for f in the K2 filter tiles
                  micro-kernel: y[f, w] (+)= FS(c0, f) x IN(c0, w)

    (*) or the whole batch's folded window run (see the contract).
    """
    b = LoopBounds(*bounds)
    nwin = b.windows_per_tile
    area = b.kernel_height * b.kernel_width
    window_tiles, filter_tiles, channel_tiles = tile_counts(b)
    blocks = (window_tiles + b.l3_tiles - 1) // b.l3_tiles
    jobs = b.groups * b.batch * blocks
    workers = workspace.size // b.workspace_stride
    if worker < workers:  # this call's share of the work
        panels, scratch, filter_tile = worker_buffers(workspace, b, worker)
        operands = (
            x_flat, filters, edge_filters, bias, y_flat, panels, scratch, residual, filter_tile
        )
        addresses = operand_addresses(operands)
        for job in range(worker * jobs // workers, (worker + 1) * jobs // workers):
            group, image, block = job_of(b, job, blocks)
            first = block * b.l3_tiles
            tiles = min(b.l3_tiles, window_tiles - first)
            for channel_index in range(channel_tiles):
                c0, channels = channel_range(b, channel_index, channel_tiles)
                panel_size = channels * area * nwin
                pack_window_tiles(
                    operands, b, image, group, c0, channels, first, tiles, panel_size, VECTOR_TOKEN
                )
                for f0 in range(0, filter_tiles, b.l2_tiles):
                    for t in range(tiles):
                        for f in range(f0, min(f0 + b.l2_tiles, filter_tiles)):
                            _tile(
                                operands,
                                addresses,
                                has_bias,
                                activation,
                                has_residual,
                                b,
                                image,
                                group,
                                c0,
                                channels,
                                f,
                                (first + t) * nwin,
                                t * panel_size,
                            )


@njit(nogil=True, cache=True)
def convolve_weight_stationary(
    worker, x_flat, filters, edge_filters, bias, has_bias, residual, activation, has_residual,
    y_flat, workspace, bounds
):
    """WS: each job keeps ``K3`` filter tiles and streams the input through.

    ::

        for worker                                              # parallel
         for job = (group, image*, filter block of K3 tiles,   # the worker's share
                    window part)                                # (plan.window_parts)
          for c0 in ceil(C/Nc) even channel tiles (<= Nc each) # partial sums in y
            for w0 in the part's blocks of K2 window tiles
              pack the K2 input tiles                           # ~ L2
              for f in the K3 filter tiles                      # one in L1, all in L3
                (filters_in_nest: pack tile f's rows of c0)     # ~ L1/L2
                for w in the K2 input tiles
                  micro-kernel: y[f, w] (+)= FS(c0, f) x IN(c0, w)

    (*) or the whole batch's folded window run (see the contract).
    """
    b = LoopBounds(*bounds)
    nwin = b.windows_per_tile
    area = b.kernel_height * b.kernel_width
    window_tiles, filter_tiles, channel_tiles = tile_counts(b)
    blocks = (filter_tiles + b.l3_tiles - 1) // b.l3_tiles
    parts = b.window_parts
    jobs = b.groups * b.batch * blocks * parts
    workers = workspace.size // b.workspace_stride
    if worker < workers:  # this call's share of the work
        panels, scratch, filter_tile = worker_buffers(workspace, b, worker)
        operands = (
            x_flat, filters, edge_filters, bias, y_flat, panels, scratch, residual, filter_tile
        )
        addresses = operand_addresses(operands)
        for job in range(worker * jobs // workers, (worker + 1) * jobs // workers):
            group, image, block_part = job_of(b, job, blocks * parts)
            block, part = block_part // parts, block_part % parts
            first_window = part * window_tiles // parts
            last_window = (part + 1) * window_tiles // parts
            first_filter = block * b.l3_tiles
            last_filter = min(first_filter + b.l3_tiles, filter_tiles)
            for channel_index in range(channel_tiles):
                c0, channels = channel_range(b, channel_index, channel_tiles)
                panel_size = channels * area * nwin
                for w0 in range(first_window, last_window, b.l2_tiles):
                    tiles = min(b.l2_tiles, last_window - w0)
                    pack_window_tiles(
                        operands, b, image, group, c0, channels, w0, tiles, panel_size, VECTOR_TOKEN
                    )
                    for f in range(first_filter, last_filter):
                        if b.filters_in_nest:
                            # KCRS rows of tile f, channels [c0, c0 + channels), into
                            # the worker's tile buffer (~ L1/L2), just before use.
                            pack_filter_tile(
                                filters, b.filters, b.channels * area, b.filters_per_tile,
                                group, f, c0 * area, channels * area, filter_tile, 0,
                                VECTOR_TOKEN,
                            )  # fmt: skip
                        for t in range(tiles):
                            _tile(
                                operands,
                                addresses,
                                has_bias,
                                activation,
                                has_residual,
                                b,
                                image,
                                group,
                                c0,
                                channels,
                                f,
                                (w0 + t) * nwin,
                                t * panel_size,
                            )


@njit(nogil=True, inline="always")
def _tile(
    operands,
    addresses,
    has_bias,
    activation,
    has_residual,
    b,
    image,
    group,
    channel_start,
    channels,
    filter_tile,
    window_start,
    panel_offset,
):
    """One micro-kernel call for output tile (filter_tile, window_start).

    Picks where the operands are read from, then writes full tiles straight
    into ``y``; edge tiles (past the last filter or window, or across two
    images) are computed into ``scratch`` and only their valid part is
    copied, so the kernel itself never sees an edge.  ``operands`` is
    ``(x_flat, filters, edge_filters, bias, y_flat, panels, scratch, residual,
    filter_tile)`` and ``addresses`` the data addresses of all but the bias and residual
    (:func:`operand_addresses`): the kernel's operands are picked among those (see
    the contract).
    """
    bias, y_flat, scratch, residual = operands[3], operands[4], operands[6], operands[7]
    x_at, filters_at, edge_filters_at, y_at, panels_at, scratch_at, tile_at = addresses
    nf = b.filters_per_tile
    nwin = b.windows_per_tile
    area = b.kernel_height * b.kernel_width
    reduction = b.channels * area
    windows = b.out_height * b.out_width  # of one image: y's row length
    filter_tiles = (b.filters + nf - 1) // nf
    filter_start = filter_tile * nf
    rows = min(nf, b.filters - filter_start)
    columns = min(nwin, b.window_images * windows - window_start)
    # The image of the tile's first window, and that window within it.
    image += window_start // windows
    local_start = window_start % windows
    depth = channels * area

    # Filters: packed panels, the KCRS array in place, or the packed edge tile.
    source = filters_at
    # Rows computed ahead of the tile's own: a last, partial tile read in
    # place takes the Nf rows that end at K, and drops the first `shift`
    # (the previous tile's), so no filter row needs packing.
    shift = 0
    if b.filters_in_nest:
        source, filter_offset = tile_at, 0
        k_stride, i_stride = nf, 1
    elif b.filters_packed:
        filter_offset = filter_panel_offset(
            group, filter_tile, channel_start, filter_tiles, reduction, area, nf
        )
        k_stride, i_stride = nf, 1
    elif b.filters >= nf:
        shift = nf - rows
        filter_offset = (
            group * b.filters + filter_start - shift
        ) * reduction + channel_start * area
        k_stride, i_stride = 1, reduction
    elif b.edge_rows:
        source = edge_filters_at
        filter_offset = group * nf * reduction + channel_start * area
        k_stride, i_stride = 1, reduction
    else:
        source = edge_filters_at
        filter_offset = (group * reduction + channel_start * area) * nf
        k_stride, i_stride = nf, 1

    # Input: the packed panel, or the input itself (1x1 or whole-input full tiles).
    inputs = panels_at
    inputs_offset = panel_offset
    inputs_stride = nwin
    if reads_in_place(b, window_start):
        plane = b.height * b.width
        inputs = x_at
        inputs_offset = (
            (image * b.groups + group) * b.channels + channel_start
        ) * plane + local_start
        inputs_stride = plane

    first = channel_start == 0
    finishing = channel_start + channels == b.channels
    last = has_bias and finishing
    bias_offset = group * filter_tiles * nf + filter_start - shift
    y_offset = ((image * b.groups + group) * b.filters + filter_start) * windows + local_start
    # A full tile goes straight into y; an edge tile into scratch (overwritten),
    # whose valid part is then copied or added into y.
    full = rows == nf and local_start + nwin <= windows
    out, out_offset, out_stride, overwrite = y_at, y_offset, windows, first
    # The epilogue in the kernel for a full tile; an edge tile's after its copy.
    tile_activation = activation if finishing else 0
    tile_residual = has_residual and finishing
    if not full:
        out, out_offset, out_stride, overwrite = scratch_at, 0, nwin, True
        tile_activation, tile_residual = 0, False
    microkernel(
        depth,
        source,
        filter_offset,
        k_stride,
        i_stride,
        inputs,
        inputs_offset,
        inputs_stride,
        out,
        out_offset,
        out_stride,
        bias,
        bias_offset,
        overwrite,
        last,
        residual,
        y_offset,
        tile_activation,
        tile_residual,
    )
    if full:
        return
    epilogue = finishing and (activation != 0 or has_residual)
    # The valid columns, one image's run at a time.
    done = 0
    while done < columns:
        local = (local_start + done) % windows
        count = min(columns - done, windows - local)
        image_index = image + (local_start + done) // windows
        start = ((image_index * b.groups + group) * b.filters + filter_start) * windows + local
        for i in range(rows):
            row = start + i * windows
            tile_row = (shift + i) * nwin + done
            if first:
                copy_run(y_flat, row, scratch, tile_row, count, VECTOR_TOKEN)
            else:
                for j in range(count):
                    y_flat[row + j] += scratch[tile_row + j]
            if epilogue:
                epilogue_run(y_flat, row, residual, row, count, activation, has_residual)
        done += count
