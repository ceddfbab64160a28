"""The Winograd family: F(2x2, 3x3) for dense 3x3 stride-1 layers.

Each 2x2 block of outputs (a *tile*) of filter ``k`` is computed from the
4x4 block of input around it (Lavin and Gray, *Fast Algorithms for
Convolutional Neural Networks*, CVPR 2016)::

    y_tile[k] = A^T [ sum_c (G g[k,c] G^T) * (B^T d[c] B) ] A

``*`` elementwise over the 16 positions ``e`` of the 4x4 transformed
tile.  For each ``e`` the sum over ``c`` is a matrix product ``M[e] =
U[e] V[e]`` (``U[e]``: ``K x C``, the transformed filters; ``V[e]``: ``C x
T``, the transformed input tiles), 16 products of ``K*C*T`` multiply-adds
where the direct convolution takes ``9*K*C*4T``: 2.25x fewer.  The
products run on the dense outer-product micro-kernel (windows in the
vectors: here tiles), the transforms on their own vector kernels
(:mod:`cso.microkernels.winograd_transforms`).

The nest (:mod:`cso.macrokernel.winograd`) works a block of tiles at a
time, so that the block's ``V`` and ``M`` stay in L2 between the input
transform, the products and the output transform; the filters' ``U`` is
transformed once a call by every worker into its own workspace.  Each of
the 16 planes of ``U``, ``V`` and ``M`` starts an odd number of cache lines
after the one before (:func:`plane_stride`): at a multiple of 4 KiB the 16
stores of a transform fell into one L1 set, and the input transform took
80 ns a call instead of 14 (a Xeon, Sapphire Rapids, warm).

Accuracy: every output passes through the transforms' additions (and the
filters' halvings) as well as the ``C``-long sums, and its rounding error
is bounded by the magnitudes of the transformed operands, not of the
products ``x*w`` (:func:`cso.reference.winograd_error_bound`).
"""

from __future__ import annotations

import functools

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from . import counts, tiles
from .choices import Algorithm, VectorOperand
from .depthwise import untiled_plan
from .hardware import Hardware
from .plan import Plan
from .pricing import Traffic, weighted_cost
from .shape_tables import kernel_shape_key
from .winograd_rules import POSITIONS, TILE

# The most tiles a block holds.  On a Xeon (Sapphire Rapids, one thread,
# 3x3 64 @56 and 128 @28) blocks of 64, 96 and 144 tiles ran within 7% of
# each other, 96 the fastest at 128 @28 (0.97 against 1.03 ms at 64).
MAX_BLOCK_TILES = 96


def tile_grid(geometry: ConvGeometry) -> tuple:
    """``(th, tw) = (ceil(P/2), ceil(Q/2))``: the output's tiles down and across."""
    return ceil_div(geometry.out_height, TILE), ceil_div(geometry.out_width, TILE)


def plane_stride(elements: int, element_bytes: int, line_bytes: int = 64) -> int:
    """Elements from one of the 16 planes to the next: ``elements`` rounded
    up to whole cache lines, one line more where that count is even, so that
    the 16 planes start in 16 different L1 sets (an odd line count is
    invertible modulo any power of two)."""
    per_line = max(1, line_bytes // element_bytes)
    lines = ceil_div(elements, per_line)
    if lines % 2 == 0:
        lines += 1
    return lines * per_line


def padded_filters(filters: int, filters_per_tile: int) -> int:
    """``K`` rounded up to whole filter tiles: ``U`` and ``M`` hold zero filters past ``K``."""
    return ceil_div(filters, filters_per_tile) * filters_per_tile


def transformed_filter_elements(filters: int, channels: int, filters_per_tile: int) -> int:
    """``16 * K_pad * C``: the elements of ``U``, the transformed filters."""
    return POSITIONS * padded_filters(filters, filters_per_tile) * channels


def filter_plane_stride(
    filters: int, channels: int, filters_per_tile: int, element_bytes: int
) -> int:
    """``U``'s plane stride (:func:`plane_stride` of ``K_pad * C``), in the
    nest's workspace and in filters packed ahead alike
    (:mod:`cso.packing.winograd_filters`)."""
    return plane_stride(padded_filters(filters, filters_per_tile) * channels, element_bytes)


def block_tiles(
    tile_count: int, windows_per_tile: int, threads: int, batch: int, largest: int
) -> int:
    """``Tb``, the tiles of a block: the fewest blocks of at most ``largest``
    tiles (:func:`largest_block`; a multiple of the threads when one image's
    blocks are all the jobs), as even as whole kernel calls make them:
    ``Tb = Nwin * ceil(T / (blocks * Nwin))``."""
    blocks = ceil_div(tile_count, max(largest, windows_per_tile))
    if batch < threads:
        blocks = max(blocks, ceil_div(threads, batch))
    blocks = min(blocks, ceil_div(tile_count, windows_per_tile))
    return windows_per_tile * ceil_div(tile_count, blocks * windows_per_tile)


def largest_block(geometry: ConvGeometry, hardware: Hardware, element_bytes: int) -> int:
    """The most tiles a block may hold: :data:`MAX_BLOCK_TILES`, and no more
    than the block's ``V`` and ``M`` (``16 * (C + K) * Tb`` elements) fit in
    the usable L2."""
    l2_usable = tiles.usable_bytes(hardware.l2_bytes, hardware.usable_fraction)
    per_tile = POSITIONS * (geometry.channels + geometry.filters) * element_bytes
    return max(1, min(MAX_BLOCK_TILES, l2_usable // per_tile))


def plan_block_tiles(plan: Plan) -> int:
    """A Winograd plan's ``Tb`` (:func:`block_tiles`)."""
    g = plan.geometry
    th, tw = tile_grid(g)
    largest = largest_block(g, plan.hardware, np.dtype(plan.dtype).itemsize)
    return block_tiles(th * tw, plan.windows_per_tile, plan.threads, g.batch, largest)


def block_sizes(tiles: int, tiles_per_block: int) -> list:
    """The tiles of each block: ``Tb`` each, the last what is left."""
    return [min(tiles_per_block, tiles - start) for start in range(0, tiles, tiles_per_block)]


def workspace_elements(geometry: ConvGeometry, filters_per_tile: int, tiles_per_block: int,
                       vector_lanes: int, element_bytes: int,
                       filters_packed: bool = False) -> tuple:  # fmt: skip
    """``(u_stride, v_stride, m_stride, row, per_worker)``: the plane strides of
    ``U`` (``K_pad x C``), ``V`` (``C x row``) and ``M`` (``K_pad x row``), a
    block row's elements (``Tb`` and a vector of slack: the input transform
    stores whole vectors), and one worker's elements, ``16`` planes of each
    (of ``V`` and ``M`` only where the filters come packed ahead,
    ``filters_packed``: ``U`` is then the filters operand)."""
    g = geometry
    filters = padded_filters(g.filters, filters_per_tile)
    row = tiles_per_block + vector_lanes
    u_stride = filter_plane_stride(g.filters, g.channels, filters_per_tile, element_bytes)
    v_stride = plane_stride(g.channels * row, element_bytes)
    m_stride = plane_stride(filters * row, element_bytes)
    kept = (0 if filters_packed else u_stride) + v_stride + m_stride
    return u_stride, v_stride, m_stride, row, POSITIONS * kept


def winograd_traffic(
    geometry: ConvGeometry,
    hardware: Hardware,
    element_bytes: int,
    threads: int,
    filters_per_tile: int,
    windows_per_tile: int,
    filters_prepacked: bool = False,
) -> Traffic:
    """One image's modelled cost under the Winograd nest.

    Counts: the products' multiply-adds ``16 * K_pad * C * sum_b
    ceil(T_b / Nwin) * Nwin`` at the outer-product kernel's ``c_mac`` of
    the shape (its 1x1 table: each product is a 1x1 layer's reduction over
    ``C``), and their ``16 * K_pad/Nf * sum_b ceil(T_b/Nwin)`` calls at
    ``call_cost``; the input and output transforms' elements (``V``:
    ``16*C*T``, ``M``: ``16*K*T``) at the dense input packing's
    ``input_pack_cost``, and the filter transform's (``U``: ``16*K_pad*C``)
    at ``filter_pack_cost``, the filters' packing in the call, which it
    resembles (KCRS rows read, panels written); the compulsory bytes
    (input, filters, output) from the level they fit in, and where ``U``
    does not fit in L2, its bytes written once and read once a block from
    the level it fits in, the reads credited with the overlap
    (:func:`~cso.analysis.pricing.hidden_stream_cost`) WS's filter stream
    gets.  Measured on a Xeon (Sapphire Rapids) at
    ResNet-50's 3x3 layers, per element: input transform 64, output 40,
    filters 107-144 (weight units; that machine's calibrated
    ``input_pack_cost`` 88, ``filter_pack_cost`` 150).  Every worker
    transforms all the filters, so that cost is the busiest thread's whole,
    the rest shared by blocks.
    """
    g = geometry
    th, tw = tile_grid(g)
    tile_count = th * tw
    largest = largest_block(g, hardware, element_bytes)
    per_block = block_tiles(tile_count, windows_per_tile, threads, g.batch, largest)
    sizes = block_sizes(tile_count, per_block)
    columns = sum(ceil_div(size, windows_per_tile) for size in sizes)
    filters = padded_filters(g.filters, filters_per_tile)
    macs = POSITIONS * filters * g.channels * columns * windows_per_tile
    calls = POSITIONS * (filters // filters_per_tile) * columns
    shape = kernel_shape_key(filters_per_tile, windows_per_tile, VectorOperand.WINDOWS)
    transformed = POSITIONS * (g.channels + g.filters) * tile_count
    filter_elements = transformed_filter_elements(g.filters, g.channels, filters_per_tile)
    l2_usable = tiles.usable_bytes(hardware.l2_bytes, hardware.usable_fraction)
    l3_usable = tiles.usable_bytes(hardware.l3_bytes, hardware.usable_fraction)
    compulsory = (
        g.channels * g.height * g.width + g.filters * g.channels * 9
        + g.filters * g.out_height * g.out_width
    ) * element_bytes  # fmt: skip
    level = counts.level_of(compulsory * g.batch, l2_usable, l3_usable)
    filter_bytes = filter_elements * element_bytes
    filter_level = counts.level_of(filter_bytes, l2_usable, l3_usable)
    # U's bytes beyond L2: written by the transform, read by every block's
    # products, which stream them as WS's kernels stream their filter tiles.
    streamed = 0 if filter_level == "l2" else filter_bytes * len(sizes)
    written = 0 if filter_level == "l2" or filters_prepacked else filter_bytes
    far = streamed + written
    dram = (compulsory if level == "dram" else 0) + (far if filter_level == "dram" else 0)
    l3 = (compulsory if level == "l3" else 0) + (far if filter_level == "l3" else 0)
    counted = dict(
        dram=dram,
        l3=l3,
        l2=compulsory,
        tlb_misses=0,
        kernel_calls=calls,
        l1_spill=0,
        padded_macs=macs,
        packed_input_elements=transformed,
    )
    shared = weighted_cost(
        hardware,
        element_bytes,
        **counted,
        streamed_l3=streamed if filter_level == "l3" else 0,
        streamed_dram=streamed if filter_level == "dram" else 0,
        shared=threads > 1,
        mac_cost=hardware.weights.mac_cost_of(shape, pointwise=True),
    )
    jobs = g.batch * len(sizes)
    imbalance = counts.thread_imbalance(threads, jobs, 1, 1, 1.0)
    # Per image: the filters are transformed once a call by each worker.
    own = 0.0
    if not filters_prepacked:
        own = filter_elements * hardware.weights.filter_pack_cost * threads / g.batch
    return Traffic(
        **counted,
        cost=imbalance * shared + own,
        packed_filter_elements=filter_elements,
        imbalance=imbalance,
    )


def streams_filters_once(plan: Plan) -> bool:
    """Whether ``plan``'s transformed filters ``U`` exceed the usable L2 while
    the call has no more tiles (``N * th * tw``) than a block may hold
    (:data:`MAX_BLOCK_TILES`): each element of ``U``, read from beyond L2
    (from memory in a model run, whose weights no cache keeps between
    inferences), then serves at most that many multiply-adds a call, too
    few to hide the stream.  The model does not take such a plan unforced.

    Measured on a Xeon (Sapphire Rapids, one thread, each call on the next
    of as many copies of the operands and packed filters as fill 300 MB, so
    that the filters come from memory): Winograd against dense on ResNet's
    and VGG's 3x3 layers ``256 @14`` 1.11x the time, ``512 @14`` 1.15x,
    ``512 @7`` 1.42x (49, 49 and 16 tiles a call), where the layers of more
    tiles kept their lead (``64 @56`` 0.59x, ``128 @28`` 0.85x, ``256 @56``
    0.66x, ``512 @28`` 0.87x; 196 to 784 tiles); with the filters in cache
    ``256 @14`` had run 0.85x and ``512 @14`` 0.76-0.89x, which the cost
    model alone followed.
    """
    g = plan.geometry
    th, tw = tile_grid(g)
    u_bytes = transformed_filter_elements(g.filters, g.channels, plan.filters_per_tile)
    u_bytes *= np.dtype(plan.dtype).itemsize
    l2_usable = tiles.usable_bytes(plan.hardware.l2_bytes, plan.hardware.usable_fraction)
    return g.batch * th * tw <= MAX_BLOCK_TILES and u_bytes > l2_usable


def winograd_shapes(hardware: Hardware, element_bytes: int) -> list:
    """The micro-kernel shapes the products may run on: the dense
    window-vectorised ones (:func:`~cso.analysis.tiles.register_blocks`)."""
    return tiles.register_blocks(hardware.vector_bytes, hardware.vector_registers, element_bytes)


@functools.lru_cache(maxsize=1024)
def plan_winograd(
    geometry: ConvGeometry,
    dtype_name: str,
    hardware: Hardware,
    threads: int,
    filters_prepacked: bool = False,
    shape: tuple = None,
) -> Plan:
    """The Winograd plan of ``geometry`` (which must be :func:`is_winograd`):
    the kernel shape of least modelled cost (or ``shape``, ``(Nf, Nwin)``:
    the shape filters packed for another plan were laid out for), priced
    with the filters packed ahead or not (``filters_prepacked``), and its
    block of tiles (:func:`block_tiles`; the plan's ``windows_per_tile``
    stays the kernel's ``Nwin``, the block is derived again where needed).
    Memoised, as the planner is: plans are pure and frozen."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    options = []
    shapes = [tuple(shape)] if shape is not None else winograd_shapes(hardware, element_bytes)
    for nf, nwin in shapes:
        if nwin % lanes:
            continue
        traffic = winograd_traffic(
            geometry, hardware, element_bytes, threads, nf, nwin, filters_prepacked
        )
        options.append((traffic.cost, nf, nwin, traffic))
    if not options:
        raise ValueError(f"shape {shape} needs Nwin a multiple of the {lanes} vector lanes")
    _, nf, nwin, traffic = min(options, key=lambda option: option[0])
    return untiled_plan(
        geometry, dtype_name, hardware, threads, traffic, Algorithm.WINOGRAD, nwin,
        filters_per_tile=nf, filters_prepacked=filters_prepacked,
    )  # fmt: skip
