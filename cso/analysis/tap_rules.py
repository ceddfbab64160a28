"""The tap-kernel families' rules (depthwise and grouped): which layers
each runs, and how much a kernel call may hold in the vector registers.

Pure functions of a geometry or a register count, beside the dense tiles
of :mod:`cso.analysis.tiles`.
"""

from __future__ import annotations

# Accumulator vectors in one row of the depthwise tap kernel at most
# (:func:`cso.analysis.depthwise.kernel_options`).
MAX_SEGMENT_VECTORS = 4
# Channels per group the grouped tap plan is weighed for at most
# (:func:`is_small_grouped`): beyond them the dense kernel's panels serve
# enough filters to repay their packing.
MAX_GROUP_CHANNELS = 64


def offers_row_blocks(geometry) -> bool:
    """Whether the tap kernel may hold a block of output rows: filters 3, 5
    or 7 high, stride 1 or 2 down, no dilation down (the common depthwise
    layers).  Each such (R, stride) is a kernel of its own to compile, so
    the rarer ones take the one-row kernel, which serves every layer."""
    g = geometry
    return g.kernel_height in (3, 5, 7) and g.stride_h in (1, 2) and g.dilation_h == 1


def max_rows_per_call(
    vectors: int, kernel_height: int, vector_registers: int, filters: int = 1
) -> int:
    """Output rows a call may hold: ``F * rows * vectors <= min(regs / 2,
    regs - F * R - 2)`` for ``F`` filters a call.

    The accumulators, the ``F * R`` broadcast weights and two loaded vectors
    must fit.  On an AMD EPYC (Zen 4, 32 registers) a 3x3 layer of 144
    channels at 56x56 ran at 55% of the peak with 16 accumulators (4 x 4 or
    8 x 2 or 14 x 1) and at 32-43% with 20 (5 x 4, 10 x 2): past half the
    registers the generated loop spills.  0 when not even one row fits.
    """
    budget = min(vector_registers // 2, vector_registers - filters * kernel_height - 2)
    if filters == 1:
        return max(1, budget // vectors)
    return max(0, budget // (vectors * filters))


def shared_input_rows(
    rows: int, kernel_height: int, stride_h: int = 1, dilation_h: int = 1, filters: int = 1
) -> int:
    """Input rows a tap-kernel block of ``rows`` output rows loads that feed
    more than one FMA of a column: ``|{i : F * |{(p, r) : p*sh + r*dh = i}|
    >= 2}|`` (every row read when ``F >= 2``: each load feeds ``F`` filters).

    A row feeding one FMA is read by that FMA straight from memory; the
    others stay in a register until their last FMA."""
    uses: dict = {}
    for p in range(rows):
        for r in range(kernel_height):
            row = p * stride_h + r * dilation_h
            uses[row] = uses.get(row, 0) + 1
    return sum(1 for count in uses.values() if count * filters >= 2)


def tap_live_vectors(
    rows: int, vectors: int, kernel_height: int, filters: int = 1, stride_h: int = 1,
    dilation_h: int = 1,
) -> int:  # fmt: skip
    """``F*B*v + F*R + v*L``: the vectors a tap-kernel column holds at once,
    its ``F*B*v`` accumulators, ``F*R`` broadcast weights and the ``v``
    vectors of each of its ``L`` shared input rows (:func:`shared_input_rows`:
    LLVM's scheduler issues a column's loads ahead of their FMAs)."""
    shared = shared_input_rows(rows, kernel_height, stride_h, dilation_h, filters)
    return filters * rows * vectors + filters * kernel_height + vectors * shared


def max_tap_rows(
    vectors: int, kernel_height: int, vector_registers: int, filters: int = 1,
    stride_h: int = 1, dilation_h: int = 1,
) -> int:  # fmt: skip
    """Output rows a tap-kernel block may hold: :func:`max_rows_per_call`'s
    rows, and for one filter a call no more than keep its
    :func:`tap_live_vectors` within the vector registers.

    Past ``regs`` live vectors the generated column loop spills to the
    stack: counted in its machine code on a Xeon (32 registers), every block
    of 33 live vectors or more spilled (one filter: 5x5 blocks of 13-16 rows,
    7x7 of 11-16, 3x3 of 16, 5x5 at stride 2 of 10, two vectors of 5x5 in 6
    rows; two filters of 5x5 in 7 rows, four of 3x3 in 4) and none of 32 or
    fewer.  One filter's spilling blocks ran up to 2x slower than the
    largest that does not spill (480 channels at 28x28,
    ``experiments/tap_spills.py``): at one thread 7x7 in 12 rows against 10
    (2.0x) and 3x3 in 16 against 14 (1.12x); at two, 5x5 in 14 against 10
    (1.4x) and 7x7 in 12 against 10 (1.5x); 3x3 in 16 ran as fast as in 14
    at two threads and 5x5 in 14 as fast as in 10 at one.  Blocks of two
    and four filters that spill ran 6-16% faster than the ones that do not
    (ResNeXt-50's stride-2 grouped layers, both thread counts), so they keep
    the accumulator bound alone.
    """
    most = max_rows_per_call(vectors, kernel_height, vector_registers, filters)
    if filters > 1:
        return most
    while most > 1 and (
        tap_live_vectors(most, vectors, kernel_height, filters, stride_h, dilation_h)
        > vector_registers
    ):
        most -= 1
    return most


def is_small_grouped(geometry) -> bool:
    """More than one group of 2 to :data:`MAX_GROUP_CHANNELS` channels: what
    the grouped tap plan runs."""
    return geometry.groups > 1 and 2 <= geometry.channels_per_group <= MAX_GROUP_CHANNELS


# The lane tap kernel's widest filter row and longest run of pixels (its
# unrolled code grows with both): cso.analysis.lanes.
MAX_LANE_KERNEL_WIDTH = 16
MAX_LANE_OUTPUTS = 32


def is_lane_depthwise(geometry) -> bool:
    """Depthwise (``groups == C > 1``) with channel multiplier 1 (``K ==
    C``), filters at most :data:`MAX_LANE_KERNEL_WIDTH` wide: the layers the
    lane plan runs."""
    g = geometry
    return (
        g.channels_per_group == 1
        and g.groups > 1
        and g.filters_per_group == 1
        and g.kernel_width <= MAX_LANE_KERNEL_WIDTH
    )


def max_lane_outputs(kernel_width: int, vector_registers: int) -> int:
    """``min(MAX_LANE_OUTPUTS, registers - S - 2)``, at least 1: pixels the
    lane tap kernel holds in registers beside the ``S`` tap vectors of the
    current filter row and one input vector (and one to spare)."""
    return max(1, min(MAX_LANE_OUTPUTS, vector_registers - kernel_width - 2))
