"""The planner: the analysis' search for the cheapest plan of one convolution.

``plan_conv2d`` is a pure function of the problem and a :class:`Hardware`:
for each micro-kernel shape and orientation the register file allows, it
takes the channel tile from the L1 rule, the L2/L3 tile counts for both
schedules from the CSA rules (:mod:`.tiles`), prices each candidate with the
cost model (:mod:`.cost`) and returns the cheapest as a frozen :class:`Plan`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..checks import check_plannable_batch, check_threads
from ..geometry import SUPPORTED_DTYPES, ConvGeometry, make_geometry
from . import tiles
from .candidates import (
    Problem,
    TileChoice,
    make_problem,
    input_ways,
    packs_channels_outer,
    parallel_options,
    traffic,
)
from .choices import SCHEDULES, Algorithm, Schedule, VectorOperand, parse_choice
from .families import FAMILIES
from .detect import detect_hardware
from .hardware import Hardware
from .plan import Plan
from .plan_checks import whole_input_window
from .ties import SHAPE_TIE_TOLERANCE, TIE_TOLERANCE, first_within  # noqa: F401 (TIE_TOLERANCE re-exported)

_BLOCKS = {
    VectorOperand.WINDOWS: tiles.register_blocks,
    VectorOperand.FILTERS: tiles.filter_vector_blocks,
    VectorOperand.REDUCTION: tiles.dot_product_blocks,
}


def _check_tile_override(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


def plan_conv2d(
    x_shape,
    w_shape,
    *,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    dtype=np.float32,
    hardware=None,
    filters_per_tile=None,
    windows_per_tile=None,
    schedule=None,
    threads=None,
    vector_operand=None,
    filters_prepacked=False,
    fold_batch=None,
    algorithm=None,
) -> Plan:
    """Plan a convolution: the algorithm, its tiles, their cache distribution and the schedule.

    Parameters
    ----------
    x_shape, w_shape : tuple of 4 ints
        ``(N, C, H, W)`` and ``(K, C // groups, R, S)``.
    stride, padding, dilation, groups
        As for :func:`cso.conv2d`.
    dtype : float32 or float64
        Element type of the computation.
    hardware : Hardware, optional
        The machine to plan for; this one (:func:`~cso.analysis.detect.detect_hardware`)
        by default.
    filters_per_tile, windows_per_tile : int, optional
        Override the micro-kernel shape ``Nf x Nwin`` (the vectorised one
        must be a multiple of the vector lanes).
    schedule : {"IS", "WS"}, optional
        Force a schedule instead of the cost model's choice.
    threads : int, optional
        Workers to plan for, at most ``hardware.cores`` (default: all of them).
    vector_operand : {"windows", "filters", "reduction"}, optional
        Force the micro-kernel's vector dimension (see :class:`Plan`).
    filters_prepacked : bool, default False
        Whether the filters will be packed ahead of time
        (:func:`cso.pack_filters` says so).  Filter-vectorised kernels need
        every filter packed; without this the model charges that packing to
        the call (``CostWeights.filter_pack_cost`` per element, shared by the
        batch), which few batch-1 layers repay.
    fold_batch : bool, optional
        Force folding the batch into the windows (``True``) or computing
        image by image (``False``) instead of the model's choice (see
        :attr:`Plan.batch_folded`).
    algorithm : {"dense", "depthwise", "grouped", "depthwise_lanes", "depthwise_planes", \
"depthwise_rows", "winograd"}, optional
        Force the algorithm family instead of the cost model's choice
        (``"depthwise"`` needs ``groups == C``, ``"grouped"`` more than one
        group of 2 to 64 channels, ``"depthwise_lanes"`` ``groups == C ==
        K`` and filters at most 16 wide, ``"depthwise_planes"`` ``groups ==
        C``, stride 1 and ``Q == W``, ``"depthwise_rows"`` ``groups == C``
        and a horizontal stride of 1 or 2, ``"winograd"`` one group, 3x3
        filters, stride 1 and dilation 1).

    Returns
    -------
    Plan
    """
    geometry = make_geometry(
        x_shape, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    check_plannable_batch(geometry.batch, "x_shape")
    hardware = detect_hardware() if hardware is None else hardware
    if not isinstance(hardware, Hardware):
        raise TypeError(f"hardware must be a cso.Hardware, got {type(hardware).__name__}")
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    schedule = parse_choice(Schedule, schedule, "schedule")
    vector_operand = parse_choice(VectorOperand, vector_operand, "vector_operand")
    threads = check_threads(threads, hardware.cores)
    algorithm = parse_choice(Algorithm, algorithm, "algorithm")
    if fold_batch not in (None, True, False):
        raise ValueError(f"fold_batch must be True, False or None, got {fold_batch!r}")
    return plan_for_geometry(
        geometry,
        dtype.name,
        hardware,
        _check_tile_override(filters_per_tile, "filters_per_tile"),
        _check_tile_override(windows_per_tile, "windows_per_tile"),
        schedule,
        threads,
        vector_operand=vector_operand,
        filters_prepacked=bool(filters_prepacked),
        fold_batch=fold_batch,
        algorithm=algorithm,
    )


@functools.lru_cache(maxsize=1024)
def plan_for_geometry(
    geometry: ConvGeometry,
    dtype_name: str,
    hardware: Hardware,
    filters_per_tile,
    windows_per_tile,
    schedule,
    threads: int,
    *,
    vector_operand=None,
    filters_prepacked=False,
    fold_batch=None,
    algorithm=None,
) -> Plan:
    """:func:`plan_conv2d` on validated arguments (memoised: plans are pure and frozen).

    The algorithm families are weighed by their modelled cost per (group,
    image): the dense outer-product plans (:func:`_plan_dense`) and, where
    they run the layer, the tap plans (:mod:`.depthwise`: depthwise or small
    grouped), the lane plan (:mod:`.lanes`) and the others of
    :data:`~.families.FAMILIES` (planes, rows, Winograd).  Forcing any
    dense setting (a tile size, schedule, vector operand or folding) plans
    densely.
    """
    family = FAMILIES.get(algorithm)
    if family is not None:
        if not family.runs(geometry):
            raise ValueError(
                f"algorithm='{algorithm.value}' needs {family.needs}, got "
                f"{geometry.groups} group(s) of {geometry.channels_per_group} channel(s) and "
                f"{geometry.filters_per_group} filter(s), {geometry.kernel_width} wide"
            )
        return family.plan(geometry, dtype_name, hardware, threads, filters_prepacked)
    dense = _plan_dense(
        geometry,
        dtype_name,
        hardware,
        filters_per_tile,
        windows_per_tile,
        schedule,
        threads,
        vector_operand=vector_operand,
        filters_prepacked=filters_prepacked,
        fold_batch=fold_batch,
    )
    dense_forced = algorithm == Algorithm.DENSE or any(
        setting is not None
        for setting in (filters_per_tile, windows_per_tile, schedule, vector_operand, fold_batch)
    )
    if dense_forced:
        return dense
    # The cheapest of the families that run the layer and would take their
    # plan (Family.takes); ties keep the earlier: dense, then FAMILIES' order.
    options = [dense]
    for family in FAMILIES.values():
        if family.runs(geometry):
            plan = family.plan(geometry, dtype_name, hardware, threads, filters_prepacked)
            if family.takes is None or family.takes(plan):
                options.append(plan)
    return min(options, key=lambda plan: plan.cost_of(plan.schedule).cost)


def _plan_dense(
    geometry: ConvGeometry,
    dtype_name: str,
    hardware: Hardware,
    filters_per_tile,
    windows_per_tile,
    schedule,
    threads: int,
    *,
    vector_operand=None,
    filters_prepacked=False,
    fold_batch=None,
) -> Plan:
    """The cheapest dense plan.

    Every micro-kernel shape of :func:`~cso.analysis.tiles.register_blocks`
    and :func:`~cso.analysis.tiles.filter_vector_blocks`, or the one asked
    for, is planned image by image, and the cheapest is returned, or the
    same shape with the batch folded into the windows when that pads fewer
    columns (:func:`~cso.analysis.tiles.folding_saves_padding`) and costs
    less per image.
    """
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    whole_input = whole_input_window(geometry)
    if vector_operand == VectorOperand.REDUCTION and not whole_input:
        raise ValueError(
            "vector_operand='reduction' needs one window covering the whole unpadded input "
            "(a fully connected layer: P*Q = 1, R = H, S = W)"
        )
    operands = [vector_operand] if vector_operand else list(VectorOperand)
    if not whole_input:
        operands = [operand for operand in operands if operand != VectorOperand.REDUCTION]
    shapes = list(
        dict.fromkeys(
            (filters_per_tile or nf, windows_per_tile or nwin, operand)
            for operand in operands
            for nf, nwin in _BLOCKS[operand](
                hardware.vector_bytes, hardware.vector_registers, element_bytes
            )
        )
    )
    for nf, nwin, operand in shapes:
        name, size = (
            ("windows_per_tile", nwin)
            if operand == VectorOperand.WINDOWS
            else ("filters_per_tile", nf)
        )
        if operand == VectorOperand.REDUCTION:
            continue
        if size % lanes and (vector_operand or operand == VectorOperand.WINDOWS):
            raise ValueError(
                f"{name} must be a multiple of the vector lanes ({lanes}) when the "
                f"micro-kernel's vectors hold {operand}, got {size}"
            )

    def plan_for(nf, nwin, operand, folded):
        problem = make_problem(
            geometry, dtype_name, hardware, threads, operand, filters_prepacked, folded
        )
        # Read in place or packed, whichever costs less (a tie reads in place).
        plans = [_plan_for_shape(way, nf, nwin, schedule) for way in input_ways(problem)]
        return min(plans, key=lambda plan: plan.cost_of(plan.schedule).cost)

    def cost_of(plan):
        # Per image either way; a tie keeps the batch image by image.
        return (plan.cost_of(plan.schedule).cost, plan.batch_folded)

    shapes = [
        (nf, nwin, operand)
        for nf, nwin, operand in shapes
        if operand == VectorOperand.REDUCTION
        or (nf if operand == VectorOperand.FILTERS else nwin) % lanes == 0
    ]
    # A forced size combined with a block's other size may leave a tile the
    # registers cannot hold (14 rows forced beside the 8x48 block's 48 columns).
    fitting = [
        (nf, nwin, operand)
        for nf, nwin, operand in shapes
        if tiles.accumulator_vectors(nf, nwin, lanes, operand) <= hardware.vector_registers
    ]
    if not fitting:
        nf, nwin, operand = shapes[0]
        raise ValueError(
            f"a {nf}x{nwin} micro-kernel ({operand}) needs "
            f"{tiles.accumulator_vectors(nf, nwin, lanes, operand)} vector registers for its "
            f"output tile; the machine has {hardware.vector_registers}: force smaller "
            "filters_per_tile or windows_per_tile"
        )
    shapes = fitting
    if fold_batch:
        if vector_operand == VectorOperand.REDUCTION:
            raise ValueError(
                "fold_batch=True needs a micro-kernel that tiles windows, not dot products"
            )
        shapes = [shape for shape in shapes if shape[2] != VectorOperand.REDUCTION]
    # In the offered order (an exact tie keeps the earlier): the windows
    # shapes, widest first, then the filters one.
    planned = [plan_for(*shape, bool(fold_batch)) for shape in shapes]
    best = first_within(((cost_of(plan)[0], plan) for plan in planned), SHAPE_TIE_TOLERANCE)
    # Folding is weighed for the shape chosen image by image, not across
    # shapes: with the padding gone the model ranks the shapes wrongly (it
    # put 8x32 folded 4% ahead of 32x14 on l3 1x1 1024->256 @14 at batch 8,
    # which ran 1.2x slower; experiments/batch_folding.py).
    nwin, operand = best.windows_per_tile, best.vector_operand
    if (
        fold_batch is None
        and operand != VectorOperand.REDUCTION
        and tiles.folding_saves_padding(geometry.batch, geometry.windows, nwin)
    ):
        best = min(best, plan_for(best.filters_per_tile, nwin, operand, True), key=cost_of)
    return best


def _plan_for_shape(problem: Problem, nf: int, nwin: int, schedule) -> Plan:
    """The plan for one micro-kernel shape: each schedule with its cheapest
    channel tile, then the cheaper schedule (or the forced one)."""
    g = problem.geometry
    channels = g.channels_per_group
    area = g.kernel_height * g.kernel_width
    l1 = tiles.usable_bytes(problem.hardware.l1_bytes, problem.hardware.usable_fraction)
    rule_nc = tiles.channel_tile(l1, channels, area, nf, nwin, problem.element_bytes)
    chosen_tiles, costs = {}, {}
    for name in SCHEDULES:
        # Each schedule takes the channel tile (and, for WS, the way of
        # sharing work between threads) its modelled cost likes best; of
        # tied ones the deepest (fewest calls and partial-sum passes).
        options = []
        for nc in reversed(tiles.channel_tile_candidates(rule_nc, channels)):
            for k2, k3, parts in parallel_options(problem, name, nc, nf, nwin):
                choice = TileChoice(name, nc, k2, k3, parts)
                modelled = traffic(problem, nf, nwin, choice)
                options.append((modelled.cost, (modelled, choice)))
        costs[name], chosen_tiles[name] = first_within(options)
    # Of tied schedules, IS (SCHEDULES' order).
    chosen = schedule or first_within((costs[name].cost, name) for name in SCHEDULES)
    return _make_plan(problem, nf, nwin, chosen_tiles[chosen], chosen_tiles, costs)


def _make_plan(problem: Problem, nf, nwin, choice: TileChoice, by_schedule, costs) -> Plan:
    return Plan(
        schedule=Schedule(choice.schedule),
        channel_tile=choice.channel_tile,
        l2_tiles=choice.l2_tiles,
        l3_tiles=choice.l3_tiles,
        filters_per_tile=nf,
        windows_per_tile=nwin,
        dtype=problem.dtype_name,
        vector_lanes=max(1, problem.hardware.vector_bytes // problem.element_bytes),
        threads=problem.threads,
        window_parts=choice.window_parts,
        input_in_place=problem.input_in_place,
        costs=tuple((name, costs[name]) for name in SCHEDULES),
        tiles_by_schedule=tuple((name, tuple(by_schedule[name])[1:4]) for name in SCHEDULES),
        geometry=problem.geometry,
        hardware=problem.hardware,
        vector_operand=problem.vector_operand,
        filters_prepacked=problem.filters_prepacked,
        batch_folded=problem.folded,
        pack_channels_outer=packs_channels_outer(problem.geometry, problem.input_in_place),
    )
