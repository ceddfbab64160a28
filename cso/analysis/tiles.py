"""Convolution Slicing Analysis (CSA): tile sizes and their cache distribution.

One function per formula of DESIGN.md section 1.  With ``s`` the bytes per
element, ``Nc`` the channels per tile, ``R x S`` the kernel, ``Nf`` filters
and ``Nwin`` windows per micro-kernel tile::

    IN  = Nc*R*S*Nwin*s     FS = Nc*R*S*Nf*s     OUT = Nwin*Nf*s

Each rule returns the largest integer that satisfies it, bounded by what
exists and never below 1 (a tile that cannot fit is still computed, just
from a lower level of the hierarchy).
"""

from __future__ import annotations

import functools

from ..geometry import ceil_div
from .tap_rules import MAX_SEGMENT_VECTORS, max_lane_outputs, max_rows_per_call
from .plane_shapes import MAX_PLANE_CALL_VECTORS


@functools.lru_cache(maxsize=None)
def conflict_probe_shape(vector_bytes: int, vector_registers: int, l1_ways: int):
    """``(Nf, Nwin)``: the float32 window-vectorised shape of
    :func:`register_blocks` with the most rows, when it has more rows than
    the L1 has ways (else None): the calibration times its filter rows read
    in place one L1 way apart (``cso.calibrate.kernel_probes``), and the
    cost model scales that figure to other row counts
    (:func:`~cso.analysis.counts.conflicting_filter_reads`).  Memoised: the
    cost model asks for every candidate plan of a layer, and working it out
    again each time took a ninth of ``schedule_traffic``'s time."""
    shapes = register_blocks(vector_bytes, vector_registers, 4)
    overflowing = [shape for shape in shapes if shape[0] > l1_ways]
    return max(overflowing, key=lambda shape: shape[0]) if overflowing else None


def register_blocks(vector_bytes: int, vector_registers: int, element_bytes: int) -> list:
    """The micro-kernel shapes the analysis chooses among for a register file.

    The widest, :func:`register_block`; one with about half its rows
    (``Nf // 2 + 1``: 8 x 32 beside 14 x 32 with AVX-512), which tiles a
    filter count that is a multiple of 8 with no padded rows; and that
    half block three vectors wide (8 x 48), when its ``3 * Nf``
    accumulators, three input vectors and the broadcast fit the registers.
    The 8 x 48 block does as many multiply-adds per load as 14 x 32 does
    with 8 filters' rows: 1.03-1.10x the model's plans on ten of
    ResNet-50's layers at batch 1 (``experiments/forced_shapes.py``), most
    of them on the 8 x 32 block before.  Last, one vector of windows by
    half the registers' rows (16 x 16 with AVX-512, 8 x 8 with AVX2): it
    pads 196-window planes to 208 rather than 224, and ran 1.03-1.09x the
    model's plans on eight of ResNet-50's layers at one thread on an AMD
    EPYC (Zen 4), e.g. ``l3 3x3 256 @14`` 98 against 91 GFLOP/s
    (``experiments/forced_shapes.py --shapes 16x16w``); its 16 filter rows
    read in place overflow an 8-way L1 set on 1x1 layers of 1024 channels
    (49 GFLOP/s), which the cost model prices
    (:func:`~cso.analysis.counts.conflicting_filter_reads`).  The cost
    model weighs each one's padding against its calls and streams.
    """
    nf, nwin = register_block(vector_bytes, vector_registers, element_bytes)
    half = max(1, nf // 2 + 1)
    shapes = [(nf, nwin), (half, nwin)]
    lanes = max(1, vector_bytes // element_bytes)
    if 3 * half + 3 + 1 <= vector_registers:
        shapes.append((half, 3 * lanes))
    if lanes > 1:
        shapes.append((max(1, vector_registers // 2), lanes))
    return list(dict.fromkeys(shapes))


def register_block(vector_bytes: int, vector_registers: int, element_bytes: int) -> tuple:
    """The micro-kernel shape ``(Nf, Nwin)`` for a register file.

    Windows are the vector dimension, two vectors wide: ``Nwin = 2 * VL`` with
    ``VL = vector_bytes / element_bytes``.  The accumulators take ``2 * Nf``
    registers, the two input vectors two more, and one holds the broadcast
    filter value, so ``Nf = (vector_registers - 3) // 2``: 14 x 32 for float32
    with AVX-512 (measured 94% of the FMA peak here), 6 x 16 with AVX2.
    """
    lanes = max(1, vector_bytes // element_bytes)
    vectors = 2
    filters = max(1, (vector_registers - vectors - 1) // vectors)
    return filters, vectors * lanes


def filter_vector_blocks(vector_bytes: int, vector_registers: int, element_bytes: int) -> list:
    """Shapes ``(Nf, Nwin)`` of the filter-vectorised micro-kernel.

    The transpose of :func:`register_block`: two vectors of filters
    (``Nf = 2 * VL``) and ``Nwin = (vector_registers - 3) // 2`` broadcast
    windows, 32 x 14 for float32 with AVX-512.  Any window count suits it,
    so 196 windows are 14 tiles of 14 and 49 are 4 tiles (12.5% padding),
    where 32-window vectors leave 12.5% and 23% of their lanes empty.  It
    needs the filters packed (vector loads along ``Nf``).

    Also three vectors of filters by 7 windows (48 x 7 with AVX-512, when its
    21 accumulators, three filter vectors and the broadcast fit): 7 divides
    the 49, 196 and 784 windows of 7x7, 14x14 and 28x28 planes, so it pads
    none.  With filters packed ahead it ran 1.06-1.17x the 32 x 14 plans on
    ResNet-50's five 7x7-output layers at one thread (1.11-1.15x at two) on
    an AMD EPYC (Zen 4); per call the model keeps the window-vectorised
    kernels there (the filters packed in every call cost more than the
    padding), and 32 x 7 was slower than both on an AVX-512 Xeon (twice the
    filter bytes per multiply-add).
    """
    nf, nwin = register_block(vector_bytes, vector_registers, element_bytes)
    shapes = [(nwin, nf)]
    lanes = max(1, vector_bytes // element_bytes)
    if lanes > 1 and 3 * 7 + 3 + 1 <= vector_registers:
        shapes.append((3 * lanes, 7))
    return shapes


def dot_product_blocks(vector_bytes: int, vector_registers: int, element_bytes: int) -> list:
    """Shapes ``(Nf, Nwin)`` of the reduction-vectorised (dot-product) kernel:
    8 filters of one window, eight independent accumulators (enough to cover
    the FMA latency; the layers it serves are bound by memory, not FMAs)."""
    return [(8, 1)]


def folding_saves_padding(batch: int, windows: int, windows_per_tile: int) -> bool:
    """Whether folding the batch into the windows leaves fewer padded columns.

    Image by image, the micro-kernels run ``N * ceil(P*Q / Nwin) * Nwin``
    columns; folded, the ``N*P*Q`` windows are one run of
    ``ceil(N*P*Q / Nwin) * Nwin`` columns.  They differ when ``Nwin`` does
    not divide ``P*Q``: 8 images of ResNet-50's 7x7 outputs in 14-wide
    tiles pad 56 columns per 49 windows image by image, none folded (and
    its 28x28 outputs in 32-wide tiles, 2% against none).
    """
    return ceil_div(batch * windows, windows_per_tile) < batch * ceil_div(windows, windows_per_tile)


def reads_whole_input_per_window(
    kernel_height, kernel_width, height, width, padded, windows, dilated
) -> bool:
    """Whether the only window is the whole, unpadded input (``P*Q = 1``,
    ``R = H``, ``S = W``): a fully connected layer written as a convolution.

    Then window ``0``'s reduction elements ``(c*R + r)*S + s`` are the input's
    own ``c*H*W + r*W + s``, contiguous, and the filters' KCRS rows are
    contiguous too: dot products read both in place, with no packing and no
    padded lanes (VGG-16's first classifier layer: a 7x7 convolution of a
    7x7 input, 411 MB of filters).
    """
    return (
        windows == 1
        and not padded
        and not dilated
        and kernel_height == height
        and kernel_width == width
    )


def input_tile_bytes(
    channel_tile: int, kernel_area: int, windows_per_tile: int, element_bytes: int
) -> int:
    """``IN = Nc * R * S * Nwin * s``: one packed input panel."""
    return channel_tile * kernel_area * windows_per_tile * element_bytes


def filter_tile_bytes(
    channel_tile: int, kernel_area: int, filters_per_tile: int, element_bytes: int
) -> int:
    """``FS = Nc * R * S * Nf * s``: one packed filter panel."""
    return channel_tile * kernel_area * filters_per_tile * element_bytes


def output_tile_bytes(windows_per_tile: int, filters_per_tile: int, element_bytes: int) -> int:
    """``OUT = Nwin * Nf * s``: one output tile."""
    return windows_per_tile * filters_per_tile * element_bytes


def packing_source_bytes(
    channel_tile: int,
    windows_per_tile: int,
    out_width: int,
    height: int,
    width: int,
    kernel_span_h: int,
    stride_h: int,
    element_bytes: int,
) -> int:
    """``SRC = Nc * min(H, Nwin/Q * min(u, Rs) + max(0, Rs - u)) * W * s``: the
    input rows that packing one panel reads.

    ``Nwin`` windows span ``Nwin/Q`` output rows; each step of ``u = stride_h``
    output-to-input rows reads ``min(u, Rs)`` new input rows of the filter's
    vertical span ``Rs = dh*(R-1) + 1``, and the first one ``Rs - u`` more.  A
    row is read whole (its lines hold the columns the stride skips), so a 1x1
    stride-1 panel's source is exactly ``IN`` and a 1x1 stride-2 one ``2 * IN``.
    Packing reads these rows through L2 while it writes the panel there, so
    the L2 rule counts them beside the panel (:func:`l2_tiles`).
    """
    step = min(stride_h, kernel_span_h)
    rows = windows_per_tile / max(1, out_width) * step + max(0, kernel_span_h - stride_h)
    return int(channel_tile * min(height, rows) * width * element_bytes)


def usable_bytes(capacity: int, usable_fraction: float) -> int:
    """The share of a cache the tiles may take: ``floor(fraction * capacity)``."""
    return int(capacity * usable_fraction)


def channel_tile(
    l1_usable: int,
    channels: int,
    kernel_area: int,
    filters_per_tile: int,
    windows_per_tile: int,
    element_bytes: int,
) -> int:
    """``Nc``: the largest with ``IN + FS + OUT <= L1``, ``1 <= Nc <= C``.

    ``Nc * R * S * (Nwin + Nf) * s + Nwin * Nf * s <= L1``.
    """
    per_channel = kernel_area * (windows_per_tile + filters_per_tile) * element_bytes
    room = l1_usable - output_tile_bytes(windows_per_tile, filters_per_tile, element_bytes)
    return max(1, min(channels, room // per_channel))


def channel_tile_candidates(rule_value: int, channels: int) -> list:
    """The channel tiles the cost model chooses among: ``Nc = ceil(C / T_c)``
    for ``T_c`` from the L1 rule's ``ceil(C / Nc_rule)`` halving down to 1.

    The L1 rule keeps both operand tiles in L1; a deeper tile spills the
    stationary one to L2 but makes fewer, longer micro-kernel calls and fewer
    partial-sum passes, which the cost model weighs.
    """
    counts = []
    count = ceil_div(channels, max(1, rule_value))
    while True:
        counts.append(count)
        if count == 1:
            break
        count = ceil_div(count, 2)
    return sorted({ceil_div(channels, c) for c in counts})


def l2_tiles(
    l2_usable: int, resident_tile: int, streamed_tile: int, out_tile: int, available: int
) -> int:
    """``K2``: streamed tiles kept in L2 next to one resident tile.

    IS: ``(IN + SRC) + K2 * FS + K2 * OUT <= L2`` (resident = the input);
    WS: ``FS + K2 * (IN + SRC) + K2 * OUT <= L2`` (the roles swapped), where
    ``SRC`` is what packing an input panel reads (:func:`packing_source_bytes`;
    0 when the input is read in place): the caller passes ``IN + SRC`` as the
    input's tile.  Bounded by ``1 <= K2 <= available`` (the number of such
    tiles).

    Without ``SRC``, ResNet-50's ``1x1 256->128 @56`` took ``K2 = 24`` panels
    of 48 KiB, 1.10x slower than ``K2 = 12`` (a Xeon with 2 MiB of L2, one
    thread): the packed panels and the rows they are packed from both sit in
    L2.  On 3x3 layers, whose ``SRC`` is well under ``IN``, ``K2`` from 4 to
    11 ran within 1%.
    """
    return max(1, min(available, (l2_usable - resident_tile) // (streamed_tile + out_tile)))


def l3_tiles(
    l3_usable: int, resident_tile: int, streamed_tile: int, out_tile: int, k2: int, available: int
) -> int:
    """``K3``: resident tiles kept in L3 next to the ``K2`` streamed ones.

    IS: ``K3 * IN + K2 * FS + K2 * K3 * OUT <= L3``;
    WS: ``K3 * FS + K2 * IN + K2 * K3 * OUT <= L3``.
    Bounded by ``1 <= K3 <= available``.
    """
    room = l3_usable - k2 * streamed_tile
    return max(1, min(available, room // (resident_tile + k2 * out_tile)))


def parallel_cap(tiles: int, threads: int) -> int:
    """Largest block that still leaves every thread a block: ``ceil(tiles / threads)``.

    The parallel loop runs over blocks of ``K3`` resident tiles, so ``K3`` is
    capped to give each of the ``threads`` workers at least one block.
    """
    return max(1, ceil_div(tiles, max(1, threads)))


def window_parts(threads: int, outer_jobs: int, filter_blocks: int, window_tiles: int) -> int:
    """WS: into how many contiguous parts to split the window tiles.

    The parallel jobs are ``(group, image, filter block, window part)``; the
    parts make at least ``threads`` jobs of nearly equal size when the outer
    jobs alone are too few (``ceil(threads / (G*N*blocks))``, at most one
    part per window tile).  Splitting windows re-packs nothing.
    """
    return max(1, min(window_tiles, ceil_div(threads, max(1, outer_jobs * filter_blocks))))


def reads_input_in_place(
    kernel_height, kernel_width, strided, padded, plane_bytes, page_bytes
) -> bool:
    """Whether a 1x1 convolution's micro-kernel should read the input unpacked.

    A 1x1, stride-1, unpadded convolution's input panel is the input itself,
    one row per channel at a stride of one plane (``H*W``).  That saves the
    packing only while the rows are close: from half a page on, each
    reduction step lands on another page, which the hardware prefetchers do
    not follow, and packing the tile into a contiguous panel was faster
    (measured here: 59 against 108 GFLOP/s at 120x120, equal at 14x14).
    Since the micro-kernel prefetches its input rows itself, the two are
    close on ResNet-50's 56x56 and 28x28 layers (reading in place took
    0.94-1.08x the packed plan's time, no consistent winner), so the
    threshold stays where it was measured; since then packing these layers
    got 1.02-1.13x faster (channel by channel, see
    :func:`cso.packing.inputs.pack_pointwise_panels`), which can only
    favour packing above the threshold.  A strided 1x1
    convolution's windows are every ``stride``-th pixel, not a contiguous
    run: it is packed like any other (gathering the pixels straight from
    ``x`` beat subsampling it first and reading that in place by 1.02-1.14x
    on ResNet-50's three such layers).  Below the threshold the planner
    prices both ways (:func:`~cso.analysis.candidates.input_ways`)."""
    return (
        kernel_height == kernel_width == 1
        and not strided
        and not padded
        and 2 * plane_bytes <= page_bytes
    )


def is_unstrided_unpadded_pointwise(kernel_height, kernel_width, stride_h, stride_w, padded):
    """Whether a convolution is 1x1, stride 1 and unpadded: its windows are
    then runs of the input's channel planes, readable in place."""
    return kernel_height == kernel_width == 1 and stride_h == stride_w == 1 and not padded


def packs_channels_outer(kernel_height, kernel_width, strided, padded, input_in_place) -> bool:
    """Whether a 1x1 convolution's panels are packed channel by channel.

    The panels of a 1x1, stride-1, unpadded convolution whose input is not
    read in place are runs of the input's rows: copied a block of tiles at
    a time, channel by channel, each row read a run at a time (ResNet-50's
    such layers 1.02-1.13x faster than tile by tile,
    ``python experiments/variants.py --variant tile-by-tile``).
    """
    return kernel_height == kernel_width == 1 and not strided and not padded and not input_in_place


def packs_filters_in_nest(
    schedule, vector_operand, filters_prepacked, window_parts, image_jobs, l2_tiles, window_tiles
) -> bool:
    """Whether a plan packs each filter tile in its loop nest, just before
    the tile's kernel calls, instead of every panel up front.

    Filter-vectorised, packed in the call, WS with its window tiles in one
    block (``K2 >= T_w``), one part and one image job: each (channel tile,
    filter tile) is then visited once a call, so each is packed once, into
    a buffer of one tile that stays in L1/L2, and the panels never travel
    to the L3 and back (:mod:`cso.macrokernel.loops`).  Elsewhere a tile is
    visited once per window block, part or image, and is packed once, up
    front, for all of them.
    """
    return (
        schedule == "WS"
        and vector_operand == "filters"
        and not filters_prepacked
        and window_parts == 1
        and image_jobs == 1
        and l2_tiles >= window_tiles
    )


def accumulator_vectors(filters_per_tile: int, windows_per_tile: int, lanes: int,
                        vector_operand: str) -> int:
    """Vector registers a micro-kernel's output tile takes.

    ``Nf * Nwin / VL`` when its vectors hold windows or filters (``Nwin`` or
    ``Nf`` a multiple of ``VL``), ``Nf * Nwin`` dot-product accumulators when
    they hold the reduction.  The kernels keep the whole tile in registers,
    so a shape whose tile needs more than the machine has is not one cso runs.
    """
    if vector_operand == "reduction":
        return filters_per_tile * windows_per_tile
    return filters_per_tile * windows_per_tile // max(1, lanes)


def micro_kernel_shapes(vector_bytes: int, vector_registers: int, element_bytes: int) -> list:
    """Every ``(Nf, Nwin)`` the analysis offers on a machine: the window-,
    filter- and reduction-vectorised blocks and the depthwise tap kernel's
    row segments of ``F`` filters a call (``F x v*VL`` for ``v`` up to
    :data:`MAX_SEGMENT_VECTORS` and ``F`` a power of two that the registers
    hold, :func:`max_rows_per_call`) and the lane tap kernel's runs of
    pixels (``1 x n``, :func:`max_lane_outputs`), and the plane kernel's
    calls (``1 x v*VL`` up to a whole plane's
    :data:`~cso.analysis.plane_shapes.MAX_PLANE_CALL_VECTORS`)."""
    lanes = max(1, vector_bytes // element_bytes)
    segments = [
        (filters, vectors * lanes)
        for filters in (1, 2, 4, 8, 16, 32)
        for vectors in range(1, MAX_SEGMENT_VECTORS + 1)
        if filters == 1 or max_rows_per_call(vectors, 1, vector_registers, filters) >= 1
    ]
    shapes = (
        register_blocks(vector_bytes, vector_registers, element_bytes)
        + filter_vector_blocks(vector_bytes, vector_registers, element_bytes)
        + dot_product_blocks(vector_bytes, vector_registers, element_bytes)
        + segments
        + [(1, n) for n in range(1, max_lane_outputs(1, vector_registers) + 1)]
        + [(1, v * lanes) for v in range(1, MAX_PLANE_CALL_VECTORS + 1)]
    )
    return list(dict.fromkeys(shapes))
