"""Vector transposes: KCRS filter rows into filter panels.

:func:`transpose_block` transposes one ``lanes x lanes`` block in vector
registers (16 float32 or 8 float64 per AVX-512 vector): ``lanes`` masked row
loads, the shuffles of :func:`transpose_rows` (which the generated kernels
share), ``lanes`` masked row stores.  :func:`transpose_into_panels` tiles
a whole filter tensor with it.

The block transpose and the loop that calls it live in one file on purpose:
Numba's on-disk cache of a function is invalidated only by changes to the
function's own source file, and an intrinsic in another file could change
under a stale cached caller.  For the same reason :func:`masked_load_store`,
which :mod:`.vector_copy`'s and :mod:`.run_stores`' intrinsics share, is
declared here: the kernels generated from those
(:mod:`cso.macrokernel.specialise`) hash this file too.

Vector width
------------
Every intrinsic here and in :mod:`.vector_copy` takes a last argument
``vector``: a *vector token*, a tuple of ``lanes`` Nones
(:func:`vector_token`).  Its length is part of its Numba type, so each
width compiles (and caches) its own machine code, and the width comes from
the plan (``Plan.vector_lanes``, from ``Hardware.vector_bytes``), never from
a constant here.
"""

from __future__ import annotations

import sys

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..numba_cache import guard_module


def vector_token(lanes: int) -> tuple:
    """The vector token for ``lanes`` elements per vector: ``(None,) * lanes``."""
    if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 64:
        raise ValueError(f"vector lanes must be an int in [1, 64], got {lanes!r}")
    return (None,) * lanes


def token_lanes(vector) -> int:
    """The lanes a vector token's Numba type names (TypeError for anything else)."""
    if not (isinstance(vector, types.UniTuple) and vector.dtype == types.none):
        raise TypeError(f"vector must be a vector token (a tuple of Nones), got {vector}")
    return vector.count


# Two-source shuffles of 8 lanes of 32 bits that AVX (and AVX-512 on ymm)
# does in one instruction each: unpcklps, unpckhps, shufps 0x44 and 0xEE
# (within each 128-bit half), vperm2f128 0x20 and 0x31 (the halves).
_UNPACK_LOW = (0, 8, 1, 9, 4, 12, 5, 13)
_UNPACK_HIGH = (2, 10, 3, 11, 6, 14, 7, 15)
_PAIRS_LOW = (0, 1, 8, 9, 4, 5, 12, 13)
_PAIRS_HIGH = (2, 3, 10, 11, 6, 7, 14, 15)
_HALVES_LOW = (0, 1, 2, 3, 8, 9, 10, 11)
_HALVES_HIGH = (4, 5, 6, 7, 12, 13, 14, 15)


def transpose_rows(builder, rows) -> list:
    """``rows[j][i] -> result[i][j]`` for ``VL`` vectors of ``VL`` lanes, in
    registers.

    Eight 32-bit lanes (AVX2's float32): the classic 24 shuffles, each one
    instruction (unpack pairs of rows, then pairs of pairs, then swap the
    128-bit halves).  The perfect shuffle the filter packing used before,
    and the generic rounds below, took 48 there (their patterns are two
    instructions each on AVX2); with these, filter tiles packed 1.04-1.06x
    faster on a Zen 3 (``pack_filter_tiles_in_turn``, both builds in one
    process, interleaved): the packing waits mostly on its strided row
    loads, not on the shuffles.  Otherwise round ``d`` (``VL/2, .., 1``)
    swaps the ``d x d`` blocks off the diagonal of every ``2d x 2d`` block:
    ``log2 VL`` rounds of ``VL`` two-vector shuffles (one instruction each
    for four 64-bit lanes, AVX2's float64).
    """
    lanes = len(rows)
    rows = list(rows)
    i32 = ir.IntType(32)

    def shuffle(a, b, pattern):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, lanes), list(pattern)))

    element = rows[0].type.element
    if lanes == 8 and (isinstance(element, ir.FloatType) or element == ir.IntType(32)):
        unpacked = []
        for r in range(0, 8, 2):
            unpacked += [
                shuffle(rows[r], rows[r + 1], _UNPACK_LOW),
                shuffle(rows[r], rows[r + 1], _UNPACK_HIGH),
            ]
        # unpacked[4*q + h]: rows 2q, 2q + 1 (q = 0, 1 in each half-block), low or high.
        paired = []
        for block in (0, 4):
            for h in range(2):
                a, b = unpacked[block + h], unpacked[block + 2 + h]
                paired += [shuffle(a, b, _PAIRS_LOW), shuffle(a, b, _PAIRS_HIGH)]
        # paired[k] (k < 4) holds columns k and k + 4 of rows 0-3; paired[4 + k] of rows 4-7.
        return [shuffle(paired[k], paired[4 + k], _HALVES_LOW) for k in range(4)] + [
            shuffle(paired[k], paired[4 + k], _HALVES_HIGH) for k in range(4)
        ]
    step = lanes // 2
    while step:
        upper = [lanes + c - step if c & step else c for c in range(lanes)]
        lower = [lanes + c if c & step else c + step for c in range(lanes)]
        for r in range(lanes):
            if not r & step:
                a, b = rows[r], rows[r + step]
                rows[r] = shuffle(a, b, upper)
                rows[r + step] = shuffle(a, b, lower)
        step //= 2
    return rows


def prefetch_function(module):
    """``llvm.prefetch`` declared in ``module``, called as ``prefetch(i8*
    address, rw, locality, cache type)`` (0, 3, 1: a read into every level of
    the data cache)."""
    i32 = ir.IntType(32)
    return cgutils.get_or_insert_function(
        module,
        ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
        "llvm.prefetch.p0",
    )


def masked_load_store(module, vector):
    """``(load, store)``: ``llvm.masked.load`` and ``llvm.masked.store`` for
    ``vector`` (an LLVM float vector type), declared in ``module``.

    Called as ``load(pointer, align, mask, passthrough)`` and
    ``store(value, pointer, align, mask)``."""
    suffix = "f32" if isinstance(vector.element, ir.FloatType) else "f64"
    name = f"v{vector.count}{suffix}.p0"
    pointer = vector.as_pointer()
    i32 = ir.IntType(32)
    mask_type = ir.VectorType(ir.IntType(1), vector.count)
    load = cgutils.get_or_insert_function(
        module,
        ir.FunctionType(vector, [pointer, i32, mask_type, vector]),
        f"llvm.masked.load.{name}",
    )
    store = cgutils.get_or_insert_function(
        module,
        ir.FunctionType(ir.VoidType(), [vector, pointer, i32, mask_type]),
        f"llvm.masked.store.{name}",
    )
    return load, store


def check_float_pair(name, dst, src):
    """Raise TypeError unless the intrinsic ``name``'s ``dst`` and ``src`` are
    float32 or float64 arrays of one dtype (typing time, before any IR)."""
    if not (
        isinstance(dst, types.Array)
        and isinstance(src, types.Array)
        and dst.dtype == src.dtype
        and dst.dtype in (types.float32, types.float64)
    ):
        raise TypeError(f"{name} needs two float arrays of one dtype, got {dst}, {src}")


def _block_codegen(float_type, lanes: int, masked: bool):
    """The codegen of a ``lanes x lanes`` block transpose: masked loads and
    stores bounded by ``rows``, ``columns`` and ``width`` (``masked``), or
    plain vector loads and stores of a whole block."""

    def codegen(context, builder, signature, args):
        dst_a, dst_off, dst_step, src_a, src_off, src_step = args[:6]
        element = context.get_value_type(float_type)
        element_bytes = 4 if float_type == types.float32 else 8
        vector = ir.VectorType(element, lanes)
        pointer = vector.as_pointer()
        i32 = ir.IntType(32)
        intp = dst_off.type
        dst_ptr = builder.gep(
            context.make_array(signature.args[0])(context, builder, dst_a).data, [dst_off]
        )
        src_ptr = builder.gep(
            context.make_array(signature.args[3])(context, builder, src_a).data, [src_off]
        )
        lane_vector = ir.VectorType(i32, lanes)

        def row_address(base, i, step):
            address = builder.gep(base, [builder.mul(ir.Constant(intp, i), step)])
            return builder.bitcast(address, pointer)

        if masked:
            rows_v, columns_v, width_v = args[6:9]
            mask_type = ir.VectorType(ir.IntType(1), lanes)
            load, store = masked_load_store(builder.module, vector)
            lane_index = ir.Constant(lane_vector, list(range(lanes)))
            align = ir.Constant(i32, element_bytes)
            zero_vector = ir.Constant(vector, [0.0] * lanes)
            no_lanes = ir.Constant(mask_type, [0] * lanes)

            def lanes_below(count):
                undef = ir.Constant(lane_vector, ir.Undefined)
                first = builder.insert_element(
                    undef, builder.trunc(count, i32), ir.Constant(i32, 0)
                )
                splat = builder.shuffle_vector(first, undef, ir.Constant(lane_vector, [0] * lanes))
                return builder.icmp_signed("<", lane_index, splat)

            # Row i is read where i < rows (whole row) and lane < columns.
            read = lanes_below(columns_v)
            values = []
            for i in range(lanes):
                present = builder.icmp_signed("<", ir.Constant(intp, i), rows_v)
                mask = builder.select(present, read, no_lanes)
                # A missing row's load reads nothing, but at row 0's address:
                # one past the array's end made the masked load take a fault
                # assist (AMD EPYC, Zen 5: a 48-filter tile of 512 filters,
                # whose last tile has 16 missing rows, packed at 249-308 ps an
                # element against 74-79 where all rows were present).
                address = builder.select(
                    present, row_address(src_ptr, i, src_step), row_address(src_ptr, 0, src_step)
                )
                values.append(builder.call(load, [address, align, mask, zero_vector]))
        else:
            values = [
                builder.load(row_address(src_ptr, i, src_step), align=element_bytes)
                for i in range(lanes)
            ]
        values = transpose_rows(builder, values)
        if masked:
            # Row j of the transpose is stored where j < columns and lane < width.
            write = lanes_below(width_v)
            for j in range(lanes):
                present = builder.icmp_signed("<", ir.Constant(intp, j), columns_v)
                mask = builder.select(present, write, no_lanes)
                builder.call(store, [values[j], row_address(dst_ptr, j, dst_step), align, mask])
        else:
            for j in range(lanes):
                builder.store(values[j], row_address(dst_ptr, j, dst_step), align=element_bytes)
        return context.get_dummy_value()

    return codegen


@intrinsic
def transpose_block(
    typingctx,
    dst,
    dst_offset,
    dst_stride,
    src,
    src_offset,
    src_stride,
    rows,
    columns,
    width,
    vector,
):
    """``dst[dst_offset + j*dst_stride + i] = src[src_offset + i*src_stride + j]``
    for ``i < width``, ``j < columns``, reading zero for ``i >= rows``.

    ``rows <= width <= lanes`` and ``columns <= lanes``, with ``lanes`` the
    lanes of the ``vector`` token.  Masked-off lanes are neither read nor
    written, so blocks at the edges of either array cannot fault and a block
    of missing rows (``rows = 0``) writes zeros without reading.
    """
    check_float_pair("transpose_block", dst, src)
    intp = types.intp
    sig = types.void(dst, intp, intp, src, intp, intp, intp, intp, intp, vector)
    return sig, _block_codegen(dst.dtype, token_lanes(vector), masked=True)


@intrinsic
def transpose_whole_block(
    typingctx, dst, dst_offset, dst_stride, src, src_offset, src_stride, vector
):
    """:func:`transpose_block` of a whole ``lanes x lanes`` block (``rows =
    columns = width = lanes``), with plain vector loads and stores: the
    masks cost a 16x16 float32 block of a 1x1 layer's filters about 10% of
    its time on a Xeon (0.207 against 0.179 ns an element, L2-resident)."""
    check_float_pair("transpose_whole_block", dst, src)
    intp = types.intp
    sig = types.void(dst, intp, intp, src, intp, intp, vector)
    return sig, _block_codegen(dst.dtype, token_lanes(vector), masked=False)


@njit(nogil=True, inline="always")
def pack_filter_tile(
    source, filters_per_group, reduction, filters_per_tile, group, tile, row_start, row_count,
    packed, target_start, vector,
):  # fmt: skip
    """Rows ``[row_start, row_start + row_count)`` of group ``group``'s filter
    tile ``tile`` into ``packed[target_start:]`` as ``[row_count][Nf]``
    (filters past ``K_g`` zero), from filter rows ``source[G*K_g][C_g*R*S]``:
    whole ``VL x VL`` blocks with plain vector loads and stores, edge blocks
    masked, blocks of no filter written as zeros without a load.  A block of
    ``VL`` filters runs down the whole reduction before the next, so that
    ``VL`` filter rows are read at a time, not ``Nf``: on an AMD EPYC (Zen 5)
    48-filter tiles packed at 75-78 ps an element so against 100-114 with
    the reduction outermost (whole panels 70-86 against 102-119; 16 and 32
    filters alike or better)."""
    lanes = len(vector)
    first_filter = tile * filters_per_tile
    valid = min(filters_per_tile, filters_per_group - first_filter)
    rows = (group * filters_per_group + first_filter) * reduction
    row_end = row_start + row_count
    for i0 in range(0, filters_per_tile, lanes):
        width = min(lanes, filters_per_tile - i0)
        present = max(0, min(width, valid - i0))
        for k0 in range(row_start, row_end, lanes):
            columns = min(lanes, row_end - k0)
            target = target_start + (k0 - row_start) * filters_per_tile + i0
            first = rows + i0 * reduction + k0
            if present == lanes and columns == lanes:
                transpose_whole_block(
                    packed, target, filters_per_tile, source, first, reduction, vector
                )
            elif present == 0:
                # No filter of the block exists: zeros, and no load at all
                # (its rows' addresses lie past the filters).
                for j in range(columns):
                    start = target + j * filters_per_tile
                    packed[start : start + width] = 0
            else:
                transpose_block(
                    packed, target, filters_per_tile, source, first, reduction, present,
                    columns, width, vector,
                )  # fmt: skip


@njit(nogil=True, inline="always")
def _panel(source, filters_per_group, reduction, filters_per_tile, tiles, packed, vector, job):
    """Panel ``job`` (group ``job // tiles``, filter tile ``job % tiles``) of
    :func:`transpose_into_panels`: the tile's whole reduction."""
    pack_filter_tile(
        source, filters_per_group, reduction, filters_per_tile, job // tiles, job % tiles, 0,
        reduction, packed, job * reduction * filters_per_tile, vector,
    )  # fmt: skip


@njit(cache=True, nogil=True, parallel=True)
def transpose_into_panels(
    source, groups, filters_per_group, reduction, filters_per_tile, tiles, packed, vector
):
    """Filter rows ``source[G*K_g][C_g*R*S]`` into panels ``packed[G][T_f][C_g*R*S][Nf]``,
    zeros for the filters past ``K_g`` (see :mod:`cso.packing.filters`).

    One parallel job per (group, filter tile), packed by
    :func:`pack_filter_tile`.  ``vector`` is the vector token.
    """
    for job in prange(groups * tiles):
        _panel(source, filters_per_group, reduction, filters_per_tile, tiles, packed, vector, job)


@njit(cache=True, nogil=True)
def transpose_into_panels_serial(
    source, groups, filters_per_group, reduction, filters_per_tile, tiles, packed, vector
):
    """:func:`transpose_into_panels` on the calling thread alone: no parallel
    region to launch (a one-thread call packing 4608 filter elements took
    9.7 microseconds through the parallel loop and its thread settings, 4 of
    them packing)."""
    for job in range(groups * tiles):
        _panel(source, filters_per_group, reduction, filters_per_tile, tiles, packed, vector, job)


@njit(cache=True, nogil=True)
def pack_filter_tiles_in_turn(
    source, filters_per_group, reduction, filters_per_tile, tiles, row_tile, buffer, vector
):
    """Every filter tile of one group, ``row_tile`` reduction rows (a channel
    tile's) at a time, each packed into the start of ``buffer`` in turn, as
    a loop nest that packs its filters just before use does
    (:mod:`cso.macrokernel.loops`): what the calibration times."""
    for row_start in range(0, reduction, row_tile):
        rows = min(row_tile, reduction - row_start)
        for tile in range(tiles):
            pack_filter_tile(
                source, filters_per_group, reduction, filters_per_tile, 0, tile, row_start,
                rows, buffer, 0, vector,
            )  # fmt: skip


# Every cached function here compiles for several argument types, in
# whichever processes come first (cso.numba_cache).
guard_module(sys.modules[__name__])
