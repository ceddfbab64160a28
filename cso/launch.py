"""Launches: a plan's loop nest, its bounds and the workspace it needs.

Below the executor (:mod:`cso.executor`), which runs a launch on the
operands, and above the specialised loop modules
(:mod:`cso.macrokernel.specialise`): each algorithm family's launch turns
a :class:`~cso.analysis.plan.Plan` into the integers its nest loops over
(:mod:`cso.macrokernel.bounds`).  Nothing here decides: the plan did.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .analysis import depthwise, lanes, planes, rows, tap_layout, winograd
from .analysis.choices import KCRS_ALGORITHMS, Algorithm, Schedule, VectorOperand
from .analysis.plan import Plan
from .analysis.winograd_rules import POSITIONS
from .geometry import ceil_div
from .macrokernel.bounds import (
    LANE_PLANE_START, ROW_PLANE_END, ROW_PLANE_START, DepthwiseBounds, LaneBounds, LoopBounds,
    PlaneBounds, RowBounds, WinogradBounds,
)  # fmt: skip
from .macrokernel.family_modules import (
    depthwise_module, lanes_module, planes_module, rows_module, winograd_module,
)  # fmt: skip
from .macrokernel.specialise import LoopPatch, loop_module
from .macrokernel.workers import ParallelNest, serial_nest
from .packing.filters import aligned_empty
from .workspace import placeholder, worker_stride


class Launch(NamedTuple):
    """What a plan's loop nest is called with, besides the operands."""

    loop_nest: object
    bounds: tuple  # the family's bounds (cso.macrokernel.bounds) fields, as a plain tuple
    workspace_elements: int
    # the tap nest's offsets, the lane nest's pack targets, the plane nest's
    # calls and masks; None: dense
    offsets: np.ndarray = None
    # What a nest that writes no scratch takes instead of the calling thread's
    # workspace (cso.workspace), made once with the launch: the row and plane
    # nests' placeholder.  A call then skips the
    # workspace lookup, which cost 5-7 us a call right after other work had
    # left the caches cold (a Xeon, EfficientNet-B0's depthwise calls,
    # experiments/call_steps.py).
    constant_workspace: np.ndarray = None


_launches: dict = {}


def launch_for(plan: Plan, filters_packed: bool, module=None) -> Launch:
    """The loop nest, its bounds and its workspace size for ``plan``.

    ``module`` is the specialised loop module to take the nest from: by
    default the plan's own (:func:`~cso.macrokernel.specialise.loop_module`),
    and then the launch is memoised by the plan object's identity (a plan
    is frozen, and the memoised planner hands out the same object for the
    same problem), so a call costs no Python work that only depends on the
    plan.  Measurements pass a variant's module instead (not memoised).
    """
    key = (id(plan), filters_packed)
    if module is None:
        entry = _launches.get(key)
        if entry is not None and entry[0] is plan:
            return entry[1]
    launch = _make_launch(plan, filters_packed, module)
    if module is None:
        if len(_launches) >= 1024:
            _launches.clear()  # plans are few per process; this only bounds a pathological one
        _launches[key] = (plan, launch)
    return launch


def _make_launch(plan: Plan, filters_packed: bool, module) -> Launch:
    if module is None:
        module = loop_module_for(plan)
    launch = _family_launch(plan, filters_packed, module)
    if plan.algorithm in KCRS_ALGORITHMS and any(type(n) is not int for n in launch.bounds):
        # The KCRS quick call (cso.quick_launch) compiles one launch for each
        # bounds type and hands the bounds to the nest by address: all ints,
        # one tuple type a field count, as every family builds them.
        raise TypeError(f"a {plan.algorithm} nest's bounds must all be ints, got {launch.bounds}")
    # One compiled nest serves every thread count (cso.macrokernel.workers).
    if plan.threads == 1:
        return launch._replace(loop_nest=serial_nest(launch.loop_nest))
    return launch._replace(loop_nest=ParallelNest(launch.loop_nest, plan.threads))


def _family_launch(plan: Plan, filters_packed: bool, module) -> Launch:
    if plan.algorithm == Algorithm.WINOGRAD:
        return _winograd_launch(plan, filters_packed, module)
    if plan.algorithm == Algorithm.DEPTHWISE_PLANES:
        return _planes_launch(plan, module)
    if plan.algorithm == Algorithm.DEPTHWISE_ROWS:
        return _rows_launch(plan, module)
    if plan.algorithm == Algorithm.DEPTHWISE_LANES:
        return _lanes_launch(plan, module)
    if plan.algorithm in KCRS_ALGORITHMS:
        return _depthwise_launch(plan, module)
    g = plan.geometry
    filters_in_nest = plan.packs_filters_in_nest and not filters_packed
    if plan.vector_operand == VectorOperand.FILTERS and not (filters_packed or filters_in_nest):
        raise ValueError("a filter-vectorised plan packing its filters up front needs them packed")
    panel_elements, scratch_elements = _worker_elements(plan)
    scratch_offset = worker_stride(panel_elements, plan.dtype)
    filter_tile_offset = scratch_offset + worker_stride(scratch_elements, plan.dtype)
    tile_elements = 0
    if filters_in_nest:
        area = g.kernel_height * g.kernel_width
        tile_elements = plan.channel_tile * area * plan.filters_per_tile
    stride = filter_tile_offset + worker_stride(tile_elements, plan.dtype)
    bounds = LoopBounds(
        batch=plan.image_jobs,
        window_images=g.batch if plan.batch_folded else 1,
        groups=g.groups,
        channels=g.channels_per_group,
        filters=g.filters_per_group,
        kernel_height=g.kernel_height,
        kernel_width=g.kernel_width,
        stride_h=g.stride_h,
        stride_w=g.stride_w,
        dilation_h=g.dilation_h,
        dilation_w=g.dilation_w,
        height=g.height,
        width=g.width,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        out_height=g.out_height,
        out_width=g.out_width,
        channel_tile=plan.channel_tile,
        l2_tiles=plan.l2_tiles,
        l3_tiles=plan.l3_tiles,
        filters_per_tile=plan.filters_per_tile,
        windows_per_tile=plan.windows_per_tile,
        input_in_place=plan.input_in_place,
        pack_channels_outer=plan.pack_channels_outer,
        filters_packed=filters_packed,
        filters_in_nest=filters_in_nest,
        window_parts=plan.window_parts,
        edge_rows=plan.vector_operand == VectorOperand.REDUCTION,
        workspace_stride=stride,
        scratch_offset=scratch_offset,
        filter_tile_offset=filter_tile_offset,
    )
    loop_nest = (
        module.convolve_input_stationary
        if plan.schedule == Schedule.IS
        else module.convolve_weight_stationary
    )
    return Launch(loop_nest, tuple(bounds), plan.threads * stride)


def _depthwise_launch(plan: Plan, module) -> Launch:
    """The tap nest (:mod:`cso.macrokernel.depthwise`), its bounds, the
    kernel's column offsets and workspace: one packed group per worker."""
    g = plan.geometry
    segment, rows = plan.windows_per_tile, plan.rows_per_call
    lanes = plan.vector_lanes
    channel = tap_layout.packed_channel_elements(g, segment, lanes)
    stride = worker_stride(g.channels_per_group * channel, plan.dtype)
    bounds = DepthwiseBounds(
        batch=g.batch,
        groups=g.groups,
        group_channels=g.channels_per_group,
        multiplier=g.filters_per_group,
        height=g.height,
        width=g.width,
        kernel_height=g.kernel_height,
        kernel_width=g.kernel_width,
        stride_h=g.stride_h,
        stride_w=g.stride_w,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        out_height=g.out_height,
        out_width=g.out_width,
        segment=segment,
        rows_per_call=rows,
        filters_per_call=plan.filters_per_tile,
        columns=tap_layout.kernel_columns(g, rows),
        rows=tap_layout.packed_rows(g),
        phase_width=tap_layout.phase_width(g, segment, lanes),
        workspace_stride=stride,
    )
    offsets = np.array(tap_layout.kernel_offsets(g, segment, lanes, rows), dtype=np.intp)
    return Launch(module.convolve_depthwise, tuple(bounds), plan.threads * stride, offsets)


def _lanes_launch(plan: Plan, module) -> Launch:
    """The lane nest (:mod:`cso.macrokernel.lanes`), its bounds and
    workspace: one packed plane, filter block and band of staged pixels per
    worker; its offsets are where each packed pixel goes
    (:func:`~cso.analysis.lanes.pack_targets`)."""
    bounds = lane_bounds(plan)
    _check_plane(module, bounds[LANE_PLANE_START:])
    targets = lanes.pack_targets(plan.geometry, plan.vector_lanes)
    return Launch(
        module.convolve_lanes, tuple(bounds), plan.threads * bounds.workspace_stride, targets
    )


def lane_bounds(plan: Plan) -> LaneBounds:
    """A lane plan's :class:`~cso.macrokernel.bounds.LaneBounds`."""
    g = plan.geometry
    band = lanes.band_rows(g, plan.hardware, np.dtype(plan.dtype).itemsize)
    elements = lanes.workspace_elements(g, plan.vector_lanes, band)
    return LaneBounds(
        batch=g.batch,
        channels=g.channels,
        height=g.height,
        width=g.width,
        kernel_height=g.kernel_height,
        taps=g.kernel_height * g.kernel_width,
        stride_h=g.stride_h,
        stride_w=g.stride_w,
        dilation_h=g.dilation_h,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        out_height=g.out_height,
        out_width=g.out_width,
        outputs=plan.windows_per_tile,
        packed_rows=lanes.packed_rows(g),
        pitch=lanes.pitch(g),
        band_rows=band,
        workspace_stride=worker_stride(elements, plan.dtype),
    )


def _check_plane(module, plane: tuple) -> None:
    """A row or lane nest reads its plane's fields from its module's
    constants (``PLANE``; None: from the bounds): they must be the plan's."""
    if module.PLANE is not None and tuple(plane) != module.PLANE:
        raise ValueError(
            f"the loop module is built for planes {module.PLANE}, the plan's are {tuple(plane)}"
        )


def _planes_launch(plan: Plan, module) -> Launch:
    """The plane nest (:mod:`cso.macrokernel.planes`) and its bounds; no
    workspace (nothing is packed: a placeholder instead); its offsets are
    the calls a plane takes and the kernel's masks
    (:func:`~cso.analysis.planes.plane_offsets`)."""
    g = plan.geometry
    bounds = PlaneBounds(
        batch=g.batch,
        channels=g.channels,
        filters=g.filters,
        multiplier=g.filters_per_group,
        height=g.height,
        width=g.width,
        out_height=g.out_height,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        taps=g.kernel_height * g.kernel_width,
        entries=planes.mask_entries(g),
        load_span=planes.load_span(g, plan.vector_lanes, plan.hardware.vector_registers),
        workers=plan.threads,
    )
    table = planes.plane_offsets(g, plan.vector_lanes, plan.hardware.vector_registers)
    # On a 64-byte boundary: the table's lane-vector masks each fill a cache line.
    offsets = aligned_empty(table.size, np.int32)
    offsets[:] = table
    return Launch(module.convolve_planes, tuple(bounds), 0, offsets, placeholder(1, plan.dtype))


def _winograd_launch(plan: Plan, filters_packed: bool, module) -> Launch:
    """The Winograd nest (:mod:`cso.macrokernel.winograd`), its bounds and
    workspace: each worker's transformed filters (none when they come
    packed ahead, ``filters_packed``) and block of transformed input tiles
    and products (:func:`~cso.analysis.winograd.workspace_elements`); no
    offsets (a placeholder)."""
    bounds = winograd_bounds(plan, filters_packed)
    offsets = np.zeros(1, dtype=np.intp)
    return Launch(
        module.convolve_winograd, tuple(bounds), plan.threads * bounds.workspace_stride, offsets
    )


def winograd_bounds(plan: Plan, filters_packed: bool = False) -> WinogradBounds:
    """A Winograd plan's :class:`~cso.macrokernel.bounds.WinogradBounds`, its
    filters transformed ahead (``filters_packed``) or in the nest."""
    g = plan.geometry
    element_bytes = np.dtype(plan.dtype).itemsize
    th, tw = winograd.tile_grid(g)
    per_block = winograd.plan_block_tiles(plan)
    u_stride, v_stride, m_stride, row, elements = winograd.workspace_elements(
        g, plan.filters_per_tile, per_block, plan.vector_lanes, element_bytes, filters_packed
    )
    # Packed ahead, U is the filters operand: the workspace holds V and M only.
    u_elements = 0 if filters_packed else POSITIONS * u_stride
    return WinogradBounds(
        batch=g.batch,
        channels=g.channels,
        filters=g.filters,
        padded_filters=winograd.padded_filters(g.filters, plan.filters_per_tile),
        height=g.height,
        width=g.width,
        out_height=g.out_height,
        out_width=g.out_width,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        tiles_across=tw,
        tiles=th * tw,
        block_tiles=per_block,
        blocks=ceil_div(th * tw, per_block),
        row=row,
        u_stride=u_stride,
        v_stride=v_stride,
        m_stride=m_stride,
        filters_transformed=int(bool(filters_packed)),  # an int, as every bounds field
        u_elements=u_elements,
        workspace_stride=worker_stride(elements, plan.dtype),
        workers=plan.threads,
    )


def _rows_launch(plan: Plan, module) -> Launch:
    """The row nest (:mod:`cso.macrokernel.rows`), its bounds and a
    placeholder workspace (it writes no scratch); its offsets are the calls
    a row takes and the kernel's masks (:func:`~cso.analysis.rows.row_offsets`)."""
    g = plan.geometry
    vectors = plan.windows_per_tile // plan.vector_lanes
    bounds = row_bounds(plan)
    _check_plane(module, bounds[ROW_PLANE_START:ROW_PLANE_END])
    offsets = rows.row_offsets(g, plan.vector_lanes, vectors, plan.filters_per_tile)
    return Launch(module.convolve_rows, tuple(bounds), 0, offsets, placeholder(1, plan.dtype))


def row_bounds(plan: Plan) -> RowBounds:
    """A row plan's :class:`~cso.macrokernel.bounds.RowBounds`."""
    g = plan.geometry
    vectors = plan.windows_per_tile // plan.vector_lanes
    return RowBounds(
        batch=g.batch,
        channels=g.channels,
        filters=g.filters,
        multiplier=g.filters_per_group,
        height=g.height,
        width=g.width,
        out_height=g.out_height,
        out_width=g.out_width,
        stride_h=g.stride_h,
        stride_w=g.stride_w,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        taps=g.kernel_height * g.kernel_width,
        entries=rows.entries_per_call(g, vectors, plan.filters_per_tile),
        # Filters side by side load under bit sets only (no vector masks).
        vector_entries=(rows.entries_per_call(g, vectors) - vectors) * plan.vector_lanes
        if plan.filters_per_tile == 1
        else 0,
        load_span=rows.load_span(g, plan.vector_lanes, vectors),
        filters_per_call=plan.filters_per_tile,
        window_rows=rows.block_window_rows(g, plan.rows_per_call),
        workers=plan.threads,
    )


def rows_module_for(plan: Plan, patch: LoopPatch = None, fixed_plane: bool = True, **options):
    """A row plan's loop module (:func:`~cso.macrokernel.family_modules.rows_module`)
    for its planes' geometry, its kernel's inner vectors whole where every
    call's lie inside the row and its whole-load kernel storing the plan's
    tail lanes; ``fixed_plane=False`` (the plane's geometry read from the
    bounds) and ``options`` (``unmasked_inner``, ``masked_fmas``) override
    those choices, for a measurement or a test of the same plan through
    another build."""
    g = plan.geometry
    vectors = plan.windows_per_tile // plan.vector_lanes
    chosen = {
        "unmasked_inner": rows.full_interior_vectors(g, plan.vector_lanes, vectors),
        "filters": plan.filters_per_tile,
    }
    chosen.update(options)
    plane = tuple(row_bounds(plan)[ROW_PLANE_START:ROW_PLANE_END]) if fixed_plane else None
    return rows_module(
        g.kernel_height, g.kernel_width, g.dilation_h, g.dilation_w, g.stride_h, g.stride_w,
        plan.rows_per_call, vectors, plan.dtype, plan.vector_lanes, plane,
        tail_lanes=rows.tail_lanes(g, plan.vector_lanes, vectors), patch=patch, **chosen,
    )  # fmt: skip


def lanes_module_for(plan: Plan, patch: LoopPatch = None, fixed_plane: bool = True):
    """A lane plan's loop module (:func:`~cso.macrokernel.family_modules.lanes_module`)
    for its planes' geometry (``fixed_plane=False``: read from the bounds,
    for a measurement of the same plan through another build)."""
    g = plan.geometry
    plane = tuple(lane_bounds(plan)[LANE_PLANE_START:]) if fixed_plane else None
    return lanes_module(
        g.kernel_width, g.stride_w, g.dilation_w, plan.windows_per_tile, plan.dtype,
        plan.vector_lanes, plane, patch=patch,
    )  # fmt: skip


def loop_module_for(plan: Plan, patch: LoopPatch = None):
    """The loop module specialised for ``plan`` (and ``patch``, a measurement
    variant, when given): the dense nests
    bound to its micro-kernel (:func:`~cso.macrokernel.specialise.loop_module`),
    or its family's (:func:`~cso.macrokernel.family_modules.depthwise_module`,
    :func:`~cso.macrokernel.family_modules.lanes_module`,
    :func:`~cso.macrokernel.family_modules.planes_module`,
    :func:`~cso.macrokernel.family_modules.rows_module`)."""
    g = plan.geometry
    if plan.algorithm == Algorithm.WINOGRAD:
        return winograd_module(
            plan.filters_per_tile, plan.windows_per_tile, plan.dtype, plan.vector_lanes,
            plan.hardware.kernel_prefetch_distance, patch=patch,
        )  # fmt: skip
    if plan.algorithm == Algorithm.DEPTHWISE_PLANES:
        return planes_module(
            g.kernel_height, g.kernel_width, g.dilation_h, g.dilation_w,
            plan.windows_per_tile // plan.vector_lanes, plan.dtype, plan.vector_lanes,
            tail_lanes=planes.tail_lanes(g, plan.vector_lanes), patch=patch,
            whole_plane=(
                planes.plane_key(g)
                if planes.whole_plane_call(g, plan.vector_lanes, plan.hardware.vector_registers)
                else None
            ),
        )  # fmt: skip
    if plan.algorithm == Algorithm.DEPTHWISE_ROWS:
        return rows_module_for(plan, patch)
    if plan.algorithm == Algorithm.DEPTHWISE_LANES:
        return lanes_module_for(plan, patch)
    if plan.algorithm in KCRS_ALGORITHMS:
        segment, block_rows = plan.windows_per_tile, plan.rows_per_call
        return depthwise_module(
            *tap_layout.kernel_shape(g, block_rows),
            block_rows,
            segment // plan.vector_lanes,
            plan.dtype,
            plan.vector_lanes,
            depthwise.masked_rows(g, segment, block_rows),
            plan.filters_per_tile,
            patch=patch,
        )
    return loop_module(
        plan.filters_per_tile,
        plan.windows_per_tile,
        plan.dtype,
        plan.vector_lanes,
        plan.vector_operand,
        patch=patch,
        prefetch_distance=plan.hardware.kernel_prefetch_distance,
    )


def _worker_elements(plan: Plan):
    """``(panels, scratch)``: the elements one worker of the loop nest needs.

    Panels for the input tiles the schedule keeps packed at once (``K3``
    for IS, ``K2`` for WS, never more than there are window tiles), each
    ``Nc*R*S x Nwin``; scratch for one ``Nf x Nwin`` edge tile of output.
    """
    g = plan.geometry
    window_tiles = ceil_div(plan.window_count, plan.windows_per_tile)
    kept = plan.l3_tiles if plan.schedule == Schedule.IS else plan.l2_tiles
    tile = plan.channel_tile * g.kernel_height * g.kernel_width * plan.windows_per_tile
    return min(kept, window_tiles) * tile, plan.filters_per_tile * plan.windows_per_tile
