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
