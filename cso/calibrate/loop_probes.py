"""Probes through the loop nests: what a micro-kernel call, a packed input
element, a packed filter element, and the depthwise nests' calls and
transposes cost as a layer runs them (reads in place: :mod:`.in_place_probes`).

Each times whole plans (:func:`cso.measure.plan_program`, one thread,
interleaved rounds) on small synthetic layers, and divides a difference of
times by the count the cost model keeps for that quantity
(:class:`~cso.analysis.pricing.Traffic`), so that a weight is the measured
time of exactly what it multiplies.
"""

from __future__ import annotations

import numpy as np

from .. import pack_filters, plan_conv2d
from ..analysis import rows
from ..analysis.pricing import workers_read_every_panel
from ..analysis.shape_tables import kernel_shape_key
from ..analysis.retile import with_tiles
from ..executor import available_threads, pack_panels_up_front, packs_panels_up_front
from ..geometry import make_geometry
from ..measure import best_times, plan_program
from ..packing.filters import aligned_empty
from ..packing.transpose import pack_filter_tiles_in_turn, vector_token
from .timing import slope_and_intercept

# (input shape, filter shape, stride, padding): layers of ResNet-like sizes,
# small enough that each runs in a millisecond or two.
# Few channels: as the channel tile shrinks from 16 to 1 the calls grow 16x,
# to where their fixed cost outweighs the multiply-adds, so the slope is
# well above the timings' noise (on a layer of 128 channels it was not).
CALL_LAYER = ((1, 16, 56, 56), (64, 16, 3, 3), 1, 1)
# One layer per kind of input packing (cso.analysis.counts.input_pack_kind).
PACK_LAYERS = {
    "shifted": ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    "strided": ((1, 128, 56, 56), (128, 128, 3, 3), 2, 1),
    "pointwise": ((1, 256, 56, 56), (64, 256, 1, 1), 1, 0),
    "pointwise_strided": ((1, 256, 56, 56), (512, 256, 1, 1), 2, 0),
}
# The kinds whose cost grows as the output rows shorten, again on layers of
# 7 output columns (PACK_LAYERS': 56 and 28): each panel row is copied in
# segments no longer than an output row, each with a fixed cost.
NARROW_PACK_LAYERS = {
    "shifted": ((1, 256, 7, 7), (256, 256, 3, 3), 1, 1),
    "strided": ((1, 256, 14, 14), (256, 256, 3, 3), 2, 1),
    "pointwise_strided": ((1, 512, 14, 14), (512, 512, 1, 1), 2, 0),
}
# Filters read in place on a 3x3 layer (:mod:`.in_place_probes`).
FILTER_LAYER = ((1, 256, 14, 14), (256, 256, 3, 3), 1, 1)
# Every micro-kernel shape is timed on this layer, inside the loop nest.  At
# 14x14 the shapes' padding differs most (196 windows in tiles of 14 to 48),
# which the rate per padded multiply-add takes out.
SHAPE_LAYER = FILTER_LAYER
# And on this 1x1 layer, whose window tiles' 512 channels stream from L2:
# shapes rank otherwise there.  On an AMD EPYC of Zen 3 the 8 x 8 kernel ran
# 7-8% slower than the median shape on SHAPE_LAYER and 22-39% slower on 1x1
# layers of 7x7 and 14x14 outputs; 16 x 6 13-15% slower and at the median.
POINTWISE_SHAPE_LAYER = ((1, 512, 7, 7), (512, 512, 1, 1), 1, 0)
# Filters to pack: 2.4 million elements, about a millisecond, well above the
# timer's and the allocator's noise (FILTER_LAYER's 0.6 million varied by 50%).
PACK_FILTER_LAYER = ((1, 512, 14, 14), (512, 512, 3, 3), 1, 1)
# A 1x1 layer whose filter-vectorised plan packs its 65,536 filter elements
# up front every call: few enough that the packing's fixed part shows beside
# its elements (on a Xeon 63 us a call, the elements ~20 of it).
SMALL_PACK_LAYER = ((1, 512, 28, 28), (128, 512, 1, 1), 1, 0)
# Filters packed tile by tile in the loop nest: 0.5 MB, within the L2, so
# that the probe times the transposes alone.  Their bytes' trip from the L3
# or memory is charged apart, as the call's compulsory traffic; from a 9.4 MB
# layer (PACK_FILTER_LAYER) the transposes read the L3 and the figure was
# 0.18-0.19 ns an element on a Xeon against 0.10 from the L2, and the model
# kept 1x1 @7 layers on 8x32w, 1.14-1.22x slower than 48x7f packing in the nest.
TILE_PACK_LAYER = ((1, 256, 14, 14), (512, 256, 1, 1), 1, 0)
# A depthwise layer for the lane nest, its operands in L2 (0.8 MB in, 0.8
# out): 1x1 for the transposes, 3x3 for the kernel they are told apart from.
LANE_LAYER = (1, 64, 56, 56)
# A depthwise layer for the row and plane nests: 7x7 planes, one kernel call each.
ROW_LAYER = (1, 512, 7, 7)
# And for the row nest, one of wide planes: tens of calls a plane (28 blocks
# of 4 rows: with 32 registers a whole row a call, with 16 four calls a
# row), so that a plane's own work is a small part of a call's intercept
# there, and most of it on ROW_LAYER's.
WIDE_ROW_LAYER = (1, 16, 112, 112)
# The same wide planes through the tap nest: 266 calls a plane (rows of 6).
WIDE_TAP_LAYER = WIDE_ROW_LAYER
# Each comparison runs at least this long: a few rounds of a millisecond
# program are at the mercy of the first calls' page faults.
MIN_SECONDS = 0.3


def layer_operands(layer, seed=0):
    """Seeded float32 input and filters of ``layer`` (``(input shape, filter
    shape, stride, padding)``)."""
    x_shape, w_shape, _, _ = layer
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal(x_shape, dtype=np.float32),
        rng.standard_normal(w_shape, dtype=np.float32),
    )


def layer_plan(layer, hardware, **forced):
    """``layer``'s one-thread dense plan on ``hardware`` (the probes measure
    the dense nests' weights), with the ``forced`` choices of
    :func:`cso.plan_conv2d`."""
    x_shape, w_shape, stride, padding = layer
    forced = {"algorithm": "dense", **forced}
    return plan_conv2d(
        x_shape, w_shape, stride=stride, padding=padding, threads=1, hardware=hardware, **forced
    )


def kernel_call_times(hardware, rounds=5) -> tuple:
    """``(calls, seconds)``: :data:`CALL_LAYER`'s micro-kernel calls and
    best time with its channel tile halved down to one (the same
    multiply-adds, more calls of shorter depth), timed in interleaved rounds."""
    x, w = layer_operands(CALL_LAYER)
    plan = layer_plan(CALL_LAYER, hardware)
    channels = plan.geometry.channels_per_group
    tiles_tried = sorted({max(1, channels >> k) for k in range(5)}, reverse=True)
    plans = [with_tiles(plan, channel_tile=nc) for nc in tiles_tried]
    programs = {index: plan_program(p, x, w) for index, p in enumerate(plans)}
    best = best_times(programs, rounds, MIN_SECONDS)
    calls = [p.cost_of(p.schedule).kernel_calls for p in plans]
    return calls, [best[i] for i in range(len(plans))]


def kernel_call_seconds(samples) -> float:
    """The slope of time against micro-kernel calls, from samples of
    :func:`kernel_call_times` taken at several moments: each channel tile's
    quickest time, as the input packing's (:func:`input_pack_seconds`).

    Fitted to one sample at a time the slope read 26-49 ns in five
    calibrations on a shared AMD EPYC (Zen 3), and moved 5-11 of ResNet-50's
    and VGG-16's 70 plans between two of them."""
    calls = samples[0][0]
    quickest = [min(sample[1][i] for sample in samples) for i in range(len(calls))]
    return max(0.0, slope_and_intercept(calls, quickest)[0])


def input_pack_times(hardware, layer, rounds=5):
    """``(t_no_kernel, t_skeleton, packed input elements)`` of ``layer``
    (one of :data:`PACK_LAYERS`; the elements counted as the model counts
    them, each panel row in whole vectors,
    :func:`cso.analysis.counts.packed_input_elements`): the best rounds of
    the plan's loop nest with its micro-kernel a no-op and of the same nest
    that does not pack either (:data:`cso.measure.VARIANTS`); None when the
    plan packs nothing (it reads the input in place on this machine).

    Without the kernels the packing is most of what is timed: the whole
    layer less the nest that never packs differed by a few percent of the
    layer, and two calibrations of one machine measured 56 and 100 units.
    """
    x, w = layer_operands(layer)
    plan = layer_plan(layer, hardware)
    packed = plan.cost_of(plan.schedule).packed_input_elements
    if not packed:
        return None
    programs = {
        "packing": plan_program(plan, x, w, variant="no-kernel"),
        "neither": plan_program(plan, x, w, variant="skeleton"),
    }
    best = best_times(programs, rounds, MIN_SECONDS)
    return best["packing"], best["neither"], packed


def input_pack_seconds(samples) -> float:
    """Per packed element, from samples of :func:`input_pack_times` taken
    at several moments: the quickest packing less the quickest skeleton.

    The packing runs at one of two paces on a shared machine, as its other
    tenants come and go: on an AMD EPYC (Zen 3) four processes, three
    samples each a few seconds apart, read the shifted kind at 219-222 ps
    or at 342-419, switching within a process, and one calibration whose
    samples all fell in the slow pace read every kind 1.7x the next's
    (a median of six), which moved 21 of ResNet-50's and VGG-16's 70 plans.
    """
    packing = min(sample[0] for sample in samples)
    neither = min(sample[1] for sample in samples)
    return max(0.0, packing - neither) / samples[0][2]


def output_columns(layer) -> int:
    """``Q``: the output width of ``layer`` (``(input shape, filter shape,
    stride, padding)``)."""
    x_shape, w_shape, stride, padding = layer
    return make_geometry(x_shape, w_shape, stride=stride, padding=padding).out_width


def filter_pack_seconds(hardware, rounds=5) -> float:
    """:data:`PACK_FILTER_LAYER`'s filters packed up front for a
    filter-vectorised plan, as a call that does not pack them in its loop
    nest does (every panel, on this thread), per element."""
    _, w = layer_operands(PACK_FILTER_LAYER)
    plan = layer_plan(PACK_FILTER_LAYER, hardware, vector_operand="filters")
    elements = plan.cost_of(plan.schedule).packed_filter_elements
    best = best_times({"pack": lambda: pack_panels_up_front(w, plan)}, rounds, MIN_SECONDS)
    return best["pack"] / max(1, elements)


def filter_tile_pack_seconds(hardware, rounds=5) -> float:
    """:data:`TILE_PACK_LAYER`'s filters packed tile by tile into one
    tile's buffer, channel tile by channel tile, as a loop nest that packs
    them just before use does (:func:`~cso.analysis.tiles.packs_filters_in_nest`),
    per element: a filter-vectorised plan's tiles and order."""
    _, w = layer_operands(TILE_PACK_LAYER)
    plan = layer_plan(TILE_PACK_LAYER, hardware, vector_operand="filters")
    g = plan.geometry
    elements = plan.cost_of(plan.schedule).packed_filter_elements
    area = g.kernel_height * g.kernel_width
    reduction = g.channels_per_group * area
    nf = plan.filters_per_tile
    source = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
    buffer = aligned_empty(plan.channel_tile * area * nf, np.float32)
    arguments = (
        source, g.filters_per_group, reduction, nf, -(-g.filters_per_group // nf),
        plan.channel_tile * area, buffer, vector_token(plan.vector_lanes),
    )  # fmt: skip
    best = best_times({"pack": lambda: pack_filter_tiles_in_turn(*arguments)}, rounds, MIN_SECONDS)
    return best["pack"] / max(1, elements)


def filter_pack_shared_seconds(hardware, rounds=5) -> float:
    """``W * (t_call - t_packed) / E``: :data:`PACK_FILTER_LAYER` through a
    filter-vectorised plan on ``W`` workers (every core Numba has) whose
    workers each read every packed panel, per call and on filters packed
    ahead (interleaved rounds), the difference in thread time over the
    ``E`` elements packed; 0 on one core or where no such plan is made
    (``filter_pack_seconds`` then stands in)."""
    threads = min(hardware.cores, available_threads())
    if threads < 2:
        return 0.0
    x, w = layer_operands(PACK_FILTER_LAYER)
    x_shape, w_shape, stride, padding = PACK_FILTER_LAYER
    for schedule in (None, "IS"):
        plan = plan_conv2d(
            x_shape, w_shape, stride=stride, padding=padding, threads=threads,
            hardware=hardware, vector_operand="filters", schedule=schedule,
        )  # fmt: skip
        if workers_read_every_panel(threads, plan.schedule, plan.window_parts):
            break
    else:
        return 0.0
    extra = call_over_packed(plan, PACK_FILTER_LAYER, x, w, rounds)
    elements = plan.cost_of(plan.schedule).packed_filter_elements
    return max(0.0, threads * extra) / max(1, elements)


def small_pack_plan(hardware):
    """:data:`SMALL_PACK_LAYER`'s one-thread filter-vectorised plan, or None
    where it does not pack its panels up front on this machine."""
    plan = layer_plan(SMALL_PACK_LAYER, hardware, vector_operand="filters")
    return plan if packs_panels_up_front(plan) else None


def filter_pack_call_seconds(hardware, rounds=5) -> float:
    """``t_call - t_packed``: :data:`SMALL_PACK_LAYER` through
    :func:`small_pack_plan` per call less on filters packed ahead, timed in
    interleaved rounds (:func:`call_over_packed`); 0 where no such plan is
    made."""
    plan = small_pack_plan(hardware)
    if plan is None:
        return 0.0
    x, w = layer_operands(SMALL_PACK_LAYER)
    return max(0.0, call_over_packed(plan, SMALL_PACK_LAYER, x, w, rounds))


def filter_pack_call_elements(hardware) -> float:
    """The filter elements :func:`small_pack_plan` packs a call (0 with no such plan)."""
    plan = small_pack_plan(hardware)
    return 0.0 if plan is None else float(plan.cost_of(plan.schedule).packed_filter_elements)


def call_over_packed(plan, layer, x, w, rounds, times=best_times) -> float:
    """``plan``'s time per call less its time on filters packed ahead, the
    two timed in interleaved rounds (``times``: the best of each, or
    :func:`cso.measure.fast_quarter_times`)."""
    x_shape, _, stride, padding = layer
    panels = pack_filters(w, x_shape, stride=stride, padding=padding, plan=plan)
    programs = {
        "call": plan_program(plan, x, w),
        "packed": plan_program(plan, x, w, prepacked=panels),
    }
    timed = times(programs, rounds, MIN_SECONDS)
    return timed["call"] - timed["packed"]


def loop_shape_seconds(hardware, shapes, rounds=5, layer=SHAPE_LAYER) -> dict:
    """``{shape key: seconds per padded multiply-add}``: ``layer``
    (:data:`SHAPE_LAYER` or :data:`POINTWISE_SHAPE_LAYER`) planned with
    each of ``shapes`` (``(Nf, Nwin, operand)``) forced and its filters
    packed ahead (no filter packing, no in-place reads), the plans timed
    whole in interleaved rounds, each over its padded multiply-adds."""
    x, w = layer_operands(layer)
    x_shape, _, stride, padding = layer
    programs, macs = {}, {}
    for nf, nwin, operand in shapes:
        plan = layer_plan(
            layer,
            hardware,
            filters_per_tile=nf,
            windows_per_tile=nwin,
            vector_operand=operand,
            filters_prepacked=True,
        )
        panels = pack_filters(w, x_shape, stride=stride, padding=padding, plan=plan)
        key = kernel_shape_key(nf, nwin, operand)
        programs[key] = plan_program(plan, x, w, prepacked=panels)
        macs[key] = plan.cost_of(plan.schedule).padded_macs
    best = best_times(programs, rounds, MIN_SECONDS)
    return {key: best[key] / macs[key] for key in programs}


def lane_transpose_seconds(hardware, rounds=5) -> float:
    """``(t_1 - (t_3 - t_1) / 8) / E``: :data:`LANE_LAYER` through the lane
    nest as a 1x1 and as a 3x3 depthwise layer (timed in interleaved
    rounds), per element ``E`` the 1x1 plan transposes.

    The two transpose the same planes; the 3x3 kernel does nine times the
    1x1's multiply-adds, so their difference is eight one-tap kernels (at
    most: where the kernel is bound by its loads rather than its FMAs the
    one-tap kernel costs more than an eighth, and the figure errs by a few
    percent towards the transposes)."""
    channels = LANE_LAYER[1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(LANE_LAYER, dtype=np.float32)
    plans, programs = {}, {}
    for size in (1, 3):
        w = rng.standard_normal((channels, 1, size, size), dtype=np.float32)
        plans[size] = plan_conv2d(
            LANE_LAYER, w.shape, padding=size // 2, groups=channels, threads=1,
            hardware=hardware, algorithm="depthwise_lanes",
        )  # fmt: skip
        programs[size] = plan_program(plans[size], x, w)
    best = best_times(programs, rounds, MIN_SECONDS)
    one_tap = max(0.0, (best[3] - best[1]) / 8)
    # The model counts the transposed elements per channel (of one image).
    elements = channels * plans[1].cost_of(plans[1].schedule).packed_input_elements
    return max(0.0, best[1] - one_tap) / elements


def unpacked_nest_seconds(hardware, algorithm: str, rounds=5, layer=ROW_LAYER) -> tuple:
    """``(call, column, column_macs, column_loads, calls_per_plane)``:
    ``layer`` (:data:`ROW_LAYER`, :data:`WIDE_ROW_LAYER` or
    :data:`WIDE_TAP_LAYER`) through the nest
    of ``algorithm`` (``"depthwise_rows"`` or ``"depthwise_planes"``: the
    nests that read the planes as given, or ``"depthwise"``, the tap nest,
    which packs them) with 3x1 and with 3x3 filters
    (timed in interleaved rounds), each time a call: the intercept ``(3 t_1
    - t_3) / 2``, the slope ``(t_3 - t_1) / 2`` a column of taps, the
    multiply-adds and vector loads a column adds to a call by the plans' own
    counts, and the calls a plane takes (one on :data:`ROW_LAYER`).

    The two differ only in their column taps, whose FMAs and loads grow
    linearly with them, so the intercept at no column is what a call costs
    whatever its taps: the nest's and the call's fixed work, the plane's
    own (its job's indices, its blocks' window rows) shared among its calls."""
    channels = layer[1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(layer, dtype=np.float32)
    programs, calls, macs, loads = {}, {}, {}, {}
    for width in (1, 3):
        w = rng.standard_normal((channels, 1, 3, width), dtype=np.float32)
        plan = plan_conv2d(
            layer, w.shape, padding=(1, width // 2), groups=channels, threads=1,
            hardware=hardware, algorithm=algorithm,
        )  # fmt: skip
        if algorithm == "depthwise_rows":
            # One filter a call, whose cost the weights price (the model
            # prices filters side by side from it, rows.row_kernel_loads).
            plan = rows.with_filters_per_call(plan, 1)
        programs[width] = plan_program(plan, x, w)
        traffic = plan.cost_of(plan.schedule)
        calls[width] = traffic.kernel_calls * channels
        macs[width] = traffic.padded_macs / traffic.kernel_calls
        loads[width] = traffic.tap_loads / traffic.kernel_calls
    best = best_times(programs, rounds, MIN_SECONDS)
    one, three = best[1] / calls[1], best[3] / calls[3]
    return (
        max(0.0, (3 * one - three) / 2),
        max(0.0, (three - one) / 2),
        (macs[3] - macs[1]) / 2,
        (loads[3] - loads[1]) / 2,
        calls[3] / channels,
    )
