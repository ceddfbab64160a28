"""What makes a :class:`~cso.analysis.plan.Plan` one the code can run.

The loop nests, the packing and the kernel generator obey a plan without
checking it again, and plans also come from files (packed filters, the
tuned-plans store) that may be damaged or hostile.  So every plan is checked
field by field when it is made (:func:`check_plan_fields`, called by
``Plan.__post_init__``): types, ranges, consistency with its own problem and
machine, and the micro-kernels that exist.  A plan that fails does not exist.
"""

from __future__ import annotations

import functools
import math
from dataclasses import fields

import numpy as np

from ..geometry import SUPPORTED_DTYPES, ConvGeometry, ceil_div, make_geometry
from . import plane_shapes, tap_rules, tiles
from .choices import SCHEDULES, TAP_ALGORITHMS, Algorithm, VectorOperand
from .pricing import Traffic
from .hardware import Hardware
from .winograd_rules import is_winograd

_DTYPE_NAMES = {dtype.name: dtype for dtype in SUPPORTED_DTYPES}
_INT_FIELDS = (
    "channel_tile",
    "l2_tiles",
    "l3_tiles",
    "filters_per_tile",
    "windows_per_tile",
    "vector_lanes",
    "threads",
    "window_parts",
    "rows_per_call",
)
_BOOL_FIELDS = (
    "input_in_place",
    "filters_prepacked",
    "batch_folded",
    "pack_channels_outer",
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_plan_fields(plan) -> None:
    """Raise unless every field of ``plan`` is one the code can run.

    Raises
    ------
    TypeError
        A field of the wrong type.
    ValueError
        A value out of range or inconsistent with the plan's problem, machine
        or micro-kernel, naming the field.
    """
    _check_types(plan)
    check_geometry(plan.geometry)
    _check_kernel(plan)
    _check_tiles(plan)
    _check_layout(plan)
    _check_costs(plan)


def _check_types(plan) -> None:
    for name in _INT_FIELDS:
        value = getattr(plan, name)
        if not _is_int(value):
            raise TypeError(f"Plan.{name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"Plan.{name} must be >= 1, got {value}")
    for name in _BOOL_FIELDS:
        if not isinstance(getattr(plan, name), bool):
            raise TypeError(f"Plan.{name} must be a bool, got {getattr(plan, name)!r}")
    if plan.dtype not in _DTYPE_NAMES:
        raise ValueError(f"Plan.dtype must be 'float32' or 'float64', got {plan.dtype!r}")
    if plan.schedule not in SCHEDULES:
        raise ValueError(f"Plan.schedule must be one of {SCHEDULES}, got {plan.schedule!r}")
    if plan.vector_operand not in tuple(VectorOperand):
        raise ValueError(f"Plan.vector_operand is not a VectorOperand: {plan.vector_operand!r}")
    if plan.algorithm not in tuple(Algorithm):
        raise ValueError(f"Plan.algorithm is not an Algorithm: {plan.algorithm!r}")
    if not isinstance(plan.geometry, ConvGeometry):
        raise TypeError(f"Plan.geometry must be a ConvGeometry, got {plan.geometry!r}")
    if not isinstance(plan.hardware, Hardware):
        raise TypeError(f"Plan.hardware must be a Hardware, got {plan.hardware!r}")


def check_geometry(geometry: ConvGeometry) -> None:
    """Raise unless ``geometry`` is what :func:`~cso.geometry.make_geometry`
    makes of its own shapes and parameters (a consistent, valid problem)."""
    g = geometry
    for name in _GEOMETRY_FIELDS:
        if type(getattr(g, name)) is not int:
            raise TypeError(f"geometry.{name} must be an int, got {getattr(g, name)!r}")
    # Its fields are exact ints, so equal geometries are the same problem:
    # the planner makes hundreds of plans of one geometry.
    _check_remade(g)


_GEOMETRY_FIELDS = tuple(field.name for field in fields(ConvGeometry))
_NUMBERS = (int, float, np.integer, np.floating)
_TRAFFIC_FIELDS = tuple(field.name for field in fields(Traffic))


@functools.lru_cache(maxsize=1024)
def _check_remade(g: ConvGeometry) -> None:
    if g.groups < 1 or g.channels % g.groups:
        raise ValueError(f"geometry.groups ({g.groups}) must divide its channels ({g.channels})")
    remade = make_geometry(
        (g.batch, g.channels, g.height, g.width),
        (g.filters, g.channels // g.groups, g.kernel_height, g.kernel_width),
        stride=(g.stride_h, g.stride_w),
        padding=((g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right)),
        dilation=(g.dilation_h, g.dilation_w),
        groups=g.groups,
    )
    if remade != g:
        raise ValueError(f"geometry is inconsistent: {g}")


# The families that read the planes as given: the word their errors use, and
# the vectors a call of their kernel holds (of the geometry, lanes and registers).
_UNPACKED_FAMILIES = {
    Algorithm.DEPTHWISE_PLANES: ("plane", plane_shapes.vectors_per_call),
    Algorithm.DEPTHWISE_ROWS: ("row", plane_shapes.row_vectors_per_call),
}


def _check_unpacked_rows(plan) -> None:
    """A plane plan computes one run of outputs a call; a row plan a block of
    ``1 .. min(P, registers)`` output rows (:func:`~cso.analysis.plane_shapes.max_block_rows`)."""
    rows = plan.rows_per_call
    if plan.algorithm == Algorithm.DEPTHWISE_PLANES:
        if rows != 1:
            raise ValueError(f"a plane plan computes one run a call, got rows_per_call={rows}")
        return
    most = plane_shapes.max_block_rows(
        plan.geometry, plan.hardware.vector_registers, plan.vector_lanes
    )
    if not 1 <= rows <= most:
        raise ValueError(
            f"Plan.rows_per_call ({rows}) of a row plan must be in [1, {most}]: "
            f"the output's {plan.geometry.out_height} rows and the registers bound it"
        )


def _check_kernel(plan) -> None:
    hardware = plan.hardware
    element_bytes = _DTYPE_NAMES[plan.dtype].itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    if plan.vector_lanes != lanes:
        raise ValueError(
            f"Plan.vector_lanes ({plan.vector_lanes}) must be the machine's {lanes} "
            f"{plan.dtype} lanes ({hardware.vector_bytes}-byte vectors)"
        )
    if plan.threads > hardware.cores:
        raise ValueError(
            f"Plan.threads ({plan.threads}) exceeds the machine's cores ({hardware.cores})"
        )
    nf, nwin = plan.filters_per_tile, plan.windows_per_tile
    if plan.algorithm in _UNPACKED_FAMILIES:
        label, vectors_per_call = _UNPACKED_FAMILIES[plan.algorithm]
        per_call = vectors_per_call(plan.geometry, lanes, hardware.vector_registers)
        # A row plan may hold filters side by side in a vector (rows.filters_per_vector).
        side_by_side = (
            {1, plane_shapes.filters_per_vector(plan.geometry, lanes)}
            if plan.algorithm == Algorithm.DEPTHWISE_ROWS
            else {1}
        )
        if nf not in side_by_side or nwin != per_call * lanes:
            side = max(side_by_side)
            raise ValueError(
                f"a {label} plan computes 1 x {per_call * lanes} pixels a call ({per_call} "
                f"vectors of {lanes} lanes)"
                + (f", or {side} filters' side by side" if side > 1 else "")
                + f", got filters_per_tile={nf}, windows_per_tile={nwin}"
            )
        if lanes > plane_shapes.MAX_PLANE_LANES:
            raise ValueError(
                f"a {label} plan needs at most {plane_shapes.MAX_PLANE_LANES} vector lanes, "
                f"got {lanes}"
            )
        _check_unpacked_rows(plan)
        return
    if plan.algorithm == Algorithm.DEPTHWISE_LANES:
        most = min(
            plan.geometry.out_width,
            tap_rules.max_lane_outputs(plan.geometry.kernel_width, hardware.vector_registers),
        )
        if nf != 1 or not 1 <= nwin <= most:
            raise ValueError(
                f"a lane plan computes 1 x (1..{most}) pixels a call (the output's width "
                f"and the registers bound it), got filters_per_tile={nf}, windows_per_tile={nwin}"
            )
        return
    if plan.algorithm in TAP_ALGORITHMS:
        if nwin % lanes or nwin // lanes > tap_rules.MAX_SEGMENT_VECTORS:
            raise ValueError(
                f"a tap plan's row segment is 1 x (1..{tap_rules.MAX_SEGMENT_VECTORS}) vectors "
                f"of {lanes} lanes, got windows_per_tile={nwin}"
            )
        multiplier = plan.geometry.filters_per_group
        if nf < 1 or multiplier % nf:
            raise ValueError(
                f"a tap plan's filters_per_tile (filters a call) divides the {multiplier} "
                f"filters of a group, got {nf}"
            )
        height = plan.geometry.kernel_height if plan.rows_per_call > 1 else 1
        most = tap_rules.max_rows_per_call(nwin // lanes, height, hardware.vector_registers, nf)
        if plan.rows_per_call > plan.geometry.out_height:
            raise ValueError(
                f"Plan.rows_per_call ({plan.rows_per_call}) exceeds the output's "
                f"{plan.geometry.out_height} rows"
            )
        if nwin > max(lanes, plan.geometry.out_width):
            raise ValueError(
                f"a tap plan's row segment ({nwin}) is one vector or no wider than the "
                f"output's {plan.geometry.out_width} columns"
            )
        if plan.rows_per_call > most:
            raise ValueError(
                f"Plan.rows_per_call ({plan.rows_per_call}) x {nwin // lanes} vectors x {nf} "
                f"filters exceeds the registers: at most {most} rows"
            )
        return
    if plan.vector_operand == VectorOperand.WINDOWS and nwin % lanes:
        raise ValueError(
            f"Plan.windows_per_tile ({nwin}) must be a multiple of the {lanes} lanes when the "
            "micro-kernel's vectors hold windows"
        )
    if plan.vector_operand == VectorOperand.FILTERS and nf % lanes:
        raise ValueError(
            f"Plan.filters_per_tile ({nf}) must be a multiple of the {lanes} lanes when the "
            "micro-kernel's vectors hold filters"
        )
    accumulators = tiles.accumulator_vectors(nf, nwin, lanes, plan.vector_operand)
    if accumulators > hardware.vector_registers:
        raise ValueError(
            f"a {nf}x{nwin} micro-kernel ({plan.vector_operand}) needs {accumulators} vector "
            f"registers for its output tile; the machine has {hardware.vector_registers}"
        )


def _check_tiles(plan) -> None:
    g = plan.geometry
    if plan.channel_tile > g.channels_per_group:
        raise ValueError(
            f"Plan.channel_tile ({plan.channel_tile}) exceeds the channels of a group "
            f"({g.channels_per_group})"
        )
    window_count = g.windows * (g.batch if plan.batch_folded else 1)
    window_tiles = ceil_div(window_count, plan.windows_per_tile)
    filter_tiles = ceil_div(g.filters_per_group, plan.filters_per_tile)
    most = max(window_tiles, filter_tiles)
    for name in ("l2_tiles", "l3_tiles"):
        if getattr(plan, name) > most:
            raise ValueError(
                f"Plan.{name} ({getattr(plan, name)}) exceeds the problem's tiles ({most})"
            )
    if plan.window_parts > window_tiles:
        raise ValueError(
            f"Plan.window_parts ({plan.window_parts}) exceeds the window tiles ({window_tiles})"
        )


def whole_input_window(geometry: ConvGeometry) -> bool:
    """Whether the one window is the whole unpadded input (a fully connected
    layer: :func:`~cso.analysis.tiles.reads_whole_input_per_window`)."""
    return tiles.reads_whole_input_per_window(
        geometry.kernel_height,
        geometry.kernel_width,
        geometry.height,
        geometry.width,
        geometry.padded,
        geometry.windows,
        (geometry.dilation_h, geometry.dilation_w) != (1, 1),
    )


def _check_layout(plan) -> None:
    # The loop nests obey these layout decisions without checking them again.
    g = plan.geometry
    if plan.algorithm == Algorithm.DEPTHWISE and g.channels_per_group != 1:
        raise ValueError(f"a depthwise plan needs one input channel per group: got {g}")
    if plan.algorithm == Algorithm.DEPTHWISE_PLANES and not plane_shapes.is_plane_depthwise(g):
        raise ValueError(
            "a plane plan needs a depthwise layer (groups == C) at stride 1 with an output as "
            f"wide as its input: got {g}"
        )
    if plan.algorithm == Algorithm.DEPTHWISE_ROWS and not plane_shapes.is_row_depthwise(g):
        raise ValueError(
            "a row plan needs a depthwise layer (groups == C) with a horizontal stride of at "
            f"most {plane_shapes.MAX_ROW_STRIDE}: got {g}"
        )
    if plan.algorithm == Algorithm.DEPTHWISE_LANES and not tap_rules.is_lane_depthwise(g):
        raise ValueError(
            "a lane plan needs a depthwise layer of channel multiplier 1 (K == C == groups) "
            f"with filters at most {tap_rules.MAX_LANE_KERNEL_WIDTH} wide: got {g}"
        )
    if plan.algorithm == Algorithm.WINOGRAD and not (
        is_winograd(g) and plan.vector_operand == VectorOperand.WINDOWS
    ):
        raise ValueError(
            "a Winograd plan needs one group, 3x3 filters, stride 1 and dilation 1, and tiles "
            f"in its products' vectors (vector_operand='windows'): got {g}, "
            f"vector_operand='{plan.vector_operand}'"
        )
    if plan.algorithm == Algorithm.GROUPED and not tap_rules.is_small_grouped(g):
        raise ValueError(
            f"a grouped plan needs more than one group of 2 to {tap_rules.MAX_GROUP_CHANNELS} "
            f"channels: got {g}"
        )
    if plan.rows_per_call > 1 and not (
        (plan.algorithm in TAP_ALGORITHMS and tap_rules.offers_row_blocks(g))
        or plan.algorithm == Algorithm.DEPTHWISE_ROWS
    ):
        raise ValueError(
            f"rows_per_call={plan.rows_per_call} needs a row plan, or a tap plan whose "
            "filters are 3, 5 or 7 high, with stride 1 or 2 and no dilation down"
        )
    pointwise = tiles.is_unstrided_unpadded_pointwise(
        g.kernel_height, g.kernel_width, g.stride_h, g.stride_w, g.padded
    )
    whole_input = whole_input_window(g)
    if plan.vector_operand == VectorOperand.REDUCTION and not (
        whole_input and plan.input_in_place
    ):
        raise ValueError(
            "a dot-product plan (vector_operand='reduction') needs one window that is the "
            "whole unpadded input, read in place (input_in_place=True)"
        )
    dot_product = plan.vector_operand == VectorOperand.REDUCTION
    if plan.input_in_place and not (pointwise or dot_product):
        raise ValueError(
            "input_in_place=True needs a 1x1, stride-1, unpadded convolution (or a "
            f"dot-product plan): the windows of {g} are not runs of x"
        )
    if plan.pack_channels_outer and not (pointwise and not plan.input_in_place):
        raise ValueError(
            "pack_channels_outer=True needs a 1x1, stride-1, unpadded convolution whose "
            "input is packed (input_in_place=False)"
        )


def _check_costs(plan) -> None:
    # explain() and the planner's comparisons read these: numbers, finite.
    for label, pairs in (("costs", plan.costs), ("tiles_by_schedule", plan.tiles_by_schedule)):
        if not isinstance(pairs, tuple) or tuple(name for name, _ in pairs) != SCHEDULES:
            raise ValueError(f"Plan.{label} must name the schedules {SCHEDULES} in order")
    for name, traffic in plan.costs:
        for field in _TRAFFIC_FIELDS:
            value = getattr(traffic, field)
            if isinstance(value, bool) or not isinstance(value, _NUMBERS) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(
                    f"Plan.costs[{name}].{field} must be a finite number >= 0, got {value!r}"
                )
    for name, ks in plan.tiles_by_schedule:
        if len(ks) != 3 or not all(_is_int(k) and k >= 1 for k in ks):
            raise ValueError(f"Plan.tiles_by_schedule[{name}] must be 3 ints >= 1, got {ks!r}")
