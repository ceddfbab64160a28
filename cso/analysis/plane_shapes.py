"""Which layers the plane and row plans run and their kernels' shapes: the
part of :mod:`.planes` and :mod:`.rows` that the plan checks need, with no
import of the planner's modules (so :mod:`.plan_checks` can use it without
a cycle); and the lane-vector masks both families' whole-load kernels read.
"""

from __future__ import annotations

import numpy as np

from ..geometry import ConvGeometry, ceil_div

# Output vectors one kernel call holds.  The kernel issues one load per
# FMA, so it runs at the loads' rate; four chains of FMAs are enough to
# keep up with that at a four-cycle FMA latency, and more only lengthen
# the overlapping last call of each plane (on the Xeon, 4 and 6 ran alike,
# 8 and 12 up to 1.3x slower on 112x112 and 56x56 planes).
VECTORS_PER_CALL = 4

# A row-kernel call holds a whole output row (up to 8 vectors with 32
# registers) where its blocks keep this many rows in the registers
# (:func:`row_vectors_per_call`).
WHOLE_ROW_BLOCK_ROWS = 4

# Mask-table entries are int32 bit sets of the vector lanes.
MAX_PLANE_LANES = 32


def lane_vectors(bit_sets, lanes: int) -> np.ndarray:
    """Int32 bit sets of lanes (any shape) as lane vectors: int32, one more
    axis of ``lanes``, all ones where lane ``l``'s bit is set, else 0 (the
    whole-load kernels' masks, one load each, where a bit set takes AVX2 four
    instructions to expand)."""
    bits = np.asarray(bit_sets).view(np.uint32).astype(np.int64)
    return np.where((bits[..., None] >> np.arange(lanes)) & 1 == 1, -1, 0).astype(np.int32)


def is_plane_depthwise(geometry: ConvGeometry) -> bool:
    """Depthwise (``groups == C > 1``, any channel multiplier), stride 1 and
    an output as wide as the input (``Q == W``): the layers the plane plan
    runs."""
    g = geometry
    return (
        g.channels_per_group == 1
        and g.groups > 1
        and g.stride_h == 1
        and g.stride_w == 1
        and g.out_width == g.width
    )


def output_vectors(geometry: ConvGeometry, lanes: int) -> int:
    """Vectors of one output plane: ``ceil(P*Q / VL)``."""
    return ceil_div(geometry.out_height * geometry.out_width, lanes)


# A call computes a whole plane (:mod:`cso.microkernels.whole_plane_taps`,
# every tap unrolled) where its output vectors times its taps are at most
# this: 28x28 planes of 3x3 filters (49 x 9 = 441 at 16 lanes), not 56x56
# ones (1764), whose code would outgrow the decoded-instruction cache (not
# measured).  On an AMD EPYC (Zen 5), one thread, through `cso.conv2d`
# (`depthwise_families.py`), MobileNetV2's 3x3 layers ran so 1.11x faster
# than the row plan on 28x28 planes, 1.37-1.42x than the lane and row plans
# on 14x14 ones and 1.44x than the lane plan on 7x7 ones.
MAX_WHOLE_PLANE_TAPS = 512
# And at most this many output vectors (32x32 planes of 1x1 filters at 16
# lanes): the masked kernel the nest runs at the input's ends unrolls them.
MAX_PLANE_CALL_VECTORS = 64


def whole_plane_call(geometry: ConvGeometry, lanes: int, vector_registers: int) -> bool:
    """Whether one call computes a whole plane: ``V * R*S <=
    MAX_WHOLE_PLANE_TAPS`` and ``V <= MAX_PLANE_CALL_VECTORS`` for the ``V =
    ceil(P*Q / VL)`` vectors of a plane, and ``R*S <= regs / 2``: the
    kernel's broadcast weights stay in registers beside the sum and the
    loaded vectors a tap reads.  On an AMD EPYC (Zen 5), one thread, 5x5
    whole-plane kernels (25 weights in 32 registers) spilled and ran
    1.3-1.6x slower than the lane plans, and with each weight loaded where
    used 0.92x as long on 7x7 planes but 1.07-1.11x on 14x14 ones; 3x3 ones
    (9 weights) 1.1-1.45x faster.  With 16
    registers (AVX2) 3x3 filters are not offered: not measured."""
    g = geometry
    vectors = output_vectors(g, lanes)
    taps = g.kernel_height * g.kernel_width
    return (
        vectors <= MAX_PLANE_CALL_VECTORS
        and vectors * taps <= MAX_WHOLE_PLANE_TAPS
        and taps <= vector_registers // 2
    )


def vectors_per_call(geometry: ConvGeometry, lanes: int, vector_registers: int) -> int:
    """All of a plane's output vectors where one call computes it
    (:func:`whole_plane_call`), else ``min(VECTORS_PER_CALL, vectors of a
    plane)``."""
    if whole_plane_call(geometry, lanes, vector_registers):
        return output_vectors(geometry, lanes)
    return min(VECTORS_PER_CALL, output_vectors(geometry, lanes))


# The row kernel's largest horizontal stride: a stride-t row of outputs is
# every t-th element of t loaded vectors, and one two-source shuffle picks
# them from two.
MAX_ROW_STRIDE = 2


def is_row_depthwise(geometry: ConvGeometry) -> bool:
    """Depthwise (``groups == C > 1``, any channel multiplier), horizontal
    stride at most :data:`MAX_ROW_STRIDE`: the layers the row plan runs."""
    g = geometry
    return g.channels_per_group == 1 and g.groups > 1 and g.stride_w <= MAX_ROW_STRIDE


def filters_per_vector(geometry: ConvGeometry, lanes: int) -> int:
    """``F = VL // Q`` filters a row-kernel vector holds side by side (filter
    ``k0 + f`` in lanes ``[f*Q, (f+1)*Q)``) where at least two of a row of
    ``Q`` outputs fit and each filter reads its own channel (multiplier 1);
    else 1.

    Why: a narrow plane's row fills few lanes (7 of 16 at ``Q = 7``), so a
    call of one filter spends most of its FMAs on padding lanes; side by
    side, ``F`` filters' rows share every FMA, each filter's inputs loaded
    under its own lanes' mask (merged into one vector) and its weights
    broadcast into its lanes.  Prototyped in C on the Xeon (Sapphire Rapids,
    one thread, ``dw 5x5 576 @7`` from L1/L2): two filters a vector 11.4 us
    against 23.2 for the lane plan's whole call (its transposes in and out
    a third of it) and 30.4 for one filter a vector.
    """
    g = geometry
    if g.filters_per_group != 1 or 2 * g.out_width > lanes:
        return 1
    return lanes // g.out_width


def row_vectors_per_call(geometry: ConvGeometry, lanes: int, vector_registers: int) -> int:
    """``ceil(V / ceil(V / cap))`` for the ``V = ceil(Q / VL)`` vectors of an
    output row and ``cap = max(VECTORS_PER_CALL, regs // WHOLE_ROW_BLOCK_ROWS)``:
    a whole output row a call where the registers hold
    :data:`WHOLE_ROW_BLOCK_ROWS` rows of it (:func:`max_block_rows`), else
    the row split evenly among the fewest calls of at most ``cap`` vectors.

    What a row split among calls costs is its last call, which starts at
    ``Q - U*VL`` and computes the vectors before it again.  On an AMD EPYC
    (Zen 5, 32 registers, one thread), ``dw 3x3 32 @112`` in calls of the
    whole row (7 vectors, blocks of 4 rows) ran 1.15-1.25x faster than in two
    calls of 4 (128 columns for 112; blocks of 8), medians over five
    placements of the input in each of two processes; the 5x5 layer
    1.00-1.15x.  With 16 registers the cap stays 4: planned for AVX2 on that
    machine, whole rows of 7 vectors in blocks of 2 rows ran 1.05-1.35x
    slower than calls of 4 in blocks of 4.  (On the Xeon, calls of 8 and 12
    vectors that ran up to 1.3x slower than 4 on 112-wide planes computed
    128 and 192 columns for 112.)"""
    vectors = ceil_div(geometry.out_width, lanes)
    cap = max(VECTORS_PER_CALL, vector_registers // WHOLE_ROW_BLOCK_ROWS)
    return ceil_div(vectors, ceil_div(vectors, cap))


def max_block_rows(geometry: ConvGeometry, vector_registers: int, lanes: int) -> int:
    """Output rows a row-kernel call may hold: ``min(P, regs // max(U,
    VECTORS_PER_CALL))``, ``B * U`` output vectors within the registers
    and, in a call of fewer vectors a row, no more rows than a call of
    :data:`VECTORS_PER_CALL` may hold.

    Why the second bound: narrow planes' blocks of many rows ran slower,
    not faster.  On an AMD EPYC (Zen 5, 32 registers, one thread) 3x3
    layers of 14x14 planes (``U = 1``) took 3.8-4.2 ns an output row in
    blocks of 6-8 rows and 5-7.4 in blocks of 11-14, the same in four
    processes (the 14 rows the registers allowed: ``dw 3x3 384 @14`` 35 us
    against 21 in blocks of 7, 5x5 ``480 @14`` 102 against 74); 16x16 and
    28x28 planes alike in blocks of 13-16 rows; blocks of 9-10 fast in some
    processes and slow in others.  On a Zen 3 (16 registers) 14-wide planes
    (``U = 2``) ran as fast in blocks of 4-5 rows as of 7-8.  At vertical
    stride ``sh`` the bound is on the input rows a block reads, ``(B-1)*sh
    + 1`` no more than a stride-1 block's ``B``: on the Zen 5 ``dw 3x3/2``
    layers of 96 channels @112 and 144 @56 ran 1.2-1.3x faster in blocks of
    4 rows than of 7-8 (102-110 us against 129-134, 47-49 against 60-70),
    though 192 @28 ran 1.2x slower in blocks of 4 than of 7 (23.4 us
    against 19.4) and 5x5 ones 1.03-1.07x.

    The kernel finishes one vector column of its block before the next, so
    only ``B`` chains of FMAs are live at a time; the bound is the measured
    one.  On the Xeon (32 registers) 112- and 56-wide planes (``U = 4``) ran
    fastest in blocks of 4-8 rows and 1.2-1.4x slower in 14-16, while on
    14-wide ones (``U = 1``) 14 rows ran fastest (now held to 7 by the
    bound above: not measured there again).  On a Zen 3 (16 registers,
    one thread, ``dw 3x3`` layers), blocks of 4 rows of 4 vectors ran 1.05-1.17x
    faster than blocks of 2 (``32 @112`` 198 against 209 us, ``144 @56`` 207
    against 230, ``192 @28`` 114 against 133) and 5-8 rows no faster; 14-wide
    planes (``U = 2``) 7-8 rows as fast as 4-5.  (The tap kernel's tighter
    bound, half the registers, :func:`~cso.analysis.tap_rules.max_rows_per_call`,
    had held these blocks to 2 rows.)"""
    g = geometry
    vectors = row_vectors_per_call(g, lanes, vector_registers)
    rows = max(1, vector_registers // max(vectors, VECTORS_PER_CALL))
    # At vertical stride sh a block reads sh input rows an output row: no
    # more input rows than a stride-1 block of ``rows`` reads.
    return min(g.out_height, (rows - 1) // g.stride_h + 1)
