"""One candidate plan's tiles and modelled cost: what the planner searches over.

A candidate is a micro-kernel (``Nf x Nwin`` and its vector operand) with
one schedule's tiles (:class:`TileChoice`); :class:`Problem` holds what all
candidates of one orientation share.  The CSA rules (:mod:`.tiles`) size
``K2`` and ``K3``; :mod:`.cost` prices the result.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from . import cost, counts, tiles
from .choices import Schedule, VectorOperand
from .pricing import Traffic
from .hardware import Hardware
from .plan import Plan


class Problem(NamedTuple):
    """What every candidate of one micro-kernel orientation shares."""

    geometry: ConvGeometry
    dtype_name: str
    hardware: Hardware
    threads: int
    vector_operand: VectorOperand
    filters_prepacked: bool
    folded: bool
    space: "WindowSpace"
    element_bytes: int
    input_in_place: bool


class TileChoice(NamedTuple):
    """One schedule's tiles: ``Nc``, ``K2``, ``K3`` and WS's window parts."""

    schedule: Schedule
    channel_tile: int
    l2_tiles: int
    l3_tiles: int
    window_parts: int = 1


class WindowSpace(NamedTuple):
    """One job's windows: ``images`` images' ``P*Q`` each, in ``outer_jobs``
    (group, image) jobs; the batch folded makes it all images in one job."""

    outer_jobs: int
    images: int
    windows: int


def window_space(geometry: ConvGeometry, folded: bool) -> WindowSpace:
    """The window run of one job: one image's ``P*Q``, or ``N*P*Q`` folded."""
    if folded:
        return WindowSpace(geometry.groups, geometry.batch, geometry.batch * geometry.windows)
    return WindowSpace(geometry.groups * geometry.batch, 1, geometry.windows)


def make_problem(
    geometry, dtype_name, hardware, threads, operand, prepacked, folded, input_in_place=None
) -> Problem:
    """The :class:`Problem` of one orientation: shared by all its candidates.

    ``input_in_place``: whether the kernel reads the input unpacked (a
    plan's own choice, which :mod:`.plan_checks` validated); None takes
    :func:`input_read_in_place` (wherever it may: the planner then prices
    both ways, :func:`input_ways`)."""
    element_bytes = np.dtype(dtype_name).itemsize
    if input_in_place is None or operand == VectorOperand.REDUCTION:
        input_in_place = input_read_in_place(geometry, operand, element_bytes, hardware)
    return Problem(
        geometry,
        dtype_name,
        hardware,
        int(threads),
        VectorOperand(operand),
        bool(prepacked),
        bool(folded),
        window_space(geometry, folded),
        element_bytes,
        bool(input_in_place),
    )


def input_ways(problem: Problem) -> list:
    """The problems to price for ``problem``'s input: itself, and where it
    reads the input in place (not a dot product's whole-input window) the
    same problem with its panels packed, so that the planner weighs the
    reads in place (``CostWeights.in_place_input_cost``) against the
    packing (``input_pack_cost``)."""
    if not problem.input_in_place or problem.vector_operand == VectorOperand.REDUCTION:
        return [problem]
    return [problem, problem._replace(input_in_place=False)]


def cache_tiles_for(problem: Problem, schedule, nc, nf, nwin):
    """``(K2, K3)`` of ``schedule`` for channel tile ``nc``: the L2 and L3 rules."""
    g, hardware, element_bytes = problem.geometry, problem.hardware, problem.element_bytes
    area = g.kernel_height * g.kernel_width
    window_tiles = ceil_div(problem.space.windows, nwin)
    filter_tiles = ceil_div(g.filters_per_group, nf)
    in_bytes = tiles.input_tile_bytes(nc, area, nwin, element_bytes)
    fs_bytes = tiles.filter_tile_bytes(nc, area, nf, element_bytes)
    out_bytes = tiles.output_tile_bytes(nwin, nf, element_bytes)
    # The K2 and K3 blocks are swept cyclically: they get a share of the usable bytes.
    share = hardware.usable_fraction * hardware.weights.sweep_fraction
    l2 = tiles.usable_bytes(hardware.l2_bytes, share)
    l3 = tiles.usable_bytes(hardware.l3_bytes, share)
    # In L2 the input's panel sits beside the rows it is packed from.
    in_l2 = in_bytes + packing_source_tile_bytes(problem, nc, nwin)
    if schedule == Schedule.IS:
        k2 = tiles.l2_tiles(l2, in_l2, fs_bytes, out_bytes, filter_tiles)
        k3 = tiles.l3_tiles(l3, in_bytes, fs_bytes, out_bytes, k2, window_tiles)
    else:
        k2 = tiles.l2_tiles(l2, fs_bytes, in_l2, out_bytes, window_tiles)
        k3 = tiles.l3_tiles(l3, fs_bytes, in_bytes, out_bytes, k2, filter_tiles)
    return k2, k3


def packing_source_tile_bytes(problem: Problem, nc: int, nwin: int) -> int:
    """``SRC``: the input rows packing one panel of ``nc`` channels and
    ``nwin`` windows reads (:func:`~cso.analysis.tiles.packing_source_bytes`);
    0 when the plan reads its input in place (it packs nothing)."""
    if problem.input_in_place:
        return 0
    g = problem.geometry
    return tiles.packing_source_bytes(
        nc,
        nwin,
        g.out_width,
        g.height,
        g.width,
        g.dilation_h * (g.kernel_height - 1) + 1,
        g.stride_h,
        problem.element_bytes,
    )


def input_read_in_place(geometry: ConvGeometry, operand, element_bytes, hardware) -> bool:
    """Whether the micro-kernel reads the input unpacked: a dot-product plan
    (its window is the whole input) or a 1x1 layer with small planes
    (:func:`~cso.analysis.tiles.reads_input_in_place`)."""
    if operand == VectorOperand.REDUCTION:
        return True
    return tiles.reads_input_in_place(
        geometry.kernel_height,
        geometry.kernel_width,
        (geometry.stride_h, geometry.stride_w) != (1, 1),
        geometry.padded,
        geometry.height * geometry.width * element_bytes,
        hardware.page_bytes,
    )


def packs_channels_outer(geometry: ConvGeometry, input_in_place: bool) -> bool:
    """Whether a plan's panels are packed channel by channel
    (:func:`~cso.analysis.tiles.packs_channels_outer`)."""
    return tiles.packs_channels_outer(
        geometry.kernel_height,
        geometry.kernel_width,
        (geometry.stride_h, geometry.stride_w) != (1, 1),
        geometry.padded,
        input_in_place,
    )


def parallel_options(problem: Problem, schedule, nc, nf, nwin):
    """``(K2, K3, window_parts)`` ways to give every thread a job.

    The jobs are (group, image, stationary block[, window part]).  When the
    outer jobs are fewer than the threads, K3 shrinks to make more blocks;
    WS may instead keep K3 and split its windows into parts (no re-packing,
    but every part streams all of its filter block).  The cost model chooses.
    """
    k2, k3 = cache_tiles_for(problem, schedule, nc, nf, nwin)
    space = problem.space
    share = max(1, ceil_div(problem.threads, space.outer_jobs))
    window_tiles = ceil_div(space.windows, nwin)
    filter_tiles = ceil_div(problem.geometry.filters_per_group, nf)
    resident_count = window_tiles if schedule == Schedule.IS else filter_tiles
    options = [(k2, min(k3, tiles.parallel_cap(resident_count, share)), 1)]
    if schedule == Schedule.WS:
        parts = ws_window_parts(problem, nf, nwin, k3)
        if parts > 1:
            options.append((k2, k3, parts))
    return options


def ws_window_parts(problem: Problem, nf, nwin, k3) -> int:
    """WS's window parts for filter blocks of ``k3`` tiles (:func:`tiles.window_parts`)."""
    return tiles.window_parts(
        problem.threads,
        problem.space.outer_jobs,
        ceil_div(ceil_div(problem.geometry.filters_per_group, nf), k3),
        ceil_div(problem.space.windows, nwin),
    )


def traffic(problem: Problem, nf: int, nwin: int, choice: TileChoice) -> Traffic:
    g = problem.geometry
    return cost.schedule_traffic(
        choice.schedule,
        channels=g.channels_per_group,
        kernel_area=g.kernel_height * g.kernel_width,
        height=g.height,
        width=g.width,
        filters=g.filters_per_group,
        windows=g.windows,
        channel_tile=choice.channel_tile,
        filters_per_tile=nf,
        windows_per_tile=nwin,
        k2=choice.l2_tiles,
        k3=choice.l3_tiles,
        element_bytes=problem.element_bytes,
        hardware=problem.hardware,
        window_parts=choice.window_parts,
        vector_operand=problem.vector_operand,
        filters_prepacked=problem.filters_prepacked,
        batch=g.batch,
        input_in_place=problem.input_in_place,
        threads=problem.threads,
        outer_jobs=problem.space.outer_jobs,
        images=problem.space.images,
        input_pack_kind=counts.input_pack_kind(g.kernel_height, g.kernel_width, g.stride_w),
        out_width=g.out_width,
    )


def problem_of(plan: Plan) -> Problem:
    """The :class:`Problem` ``plan`` was made for."""
    return make_problem(
        plan.geometry,
        plan.dtype,
        plan.hardware,
        plan.threads,
        plan.vector_operand,
        plan.filters_prepacked,
        plan.batch_folded,
        plan.input_in_place,
    )


def schedule_cost(plan: Plan, choice: TileChoice) -> Traffic:
    """The modelled :class:`Traffic` of ``plan``'s problem and micro-kernel
    with the tiles of ``choice``."""
    return traffic(problem_of(plan), plan.filters_per_tile, plan.windows_per_tile, choice)


def cache_tiles(plan: Plan, schedule, channel_tile: int):
    """``(K2, K3)`` the CSA rules give ``schedule`` with ``channel_tile``
    for ``plan``'s problem and micro-kernel (before the thread cap)."""
    problem = problem_of(plan)
    return cache_tiles_for(
        problem, Schedule(schedule), channel_tile, plan.filters_per_tile, plan.windows_per_tile
    )
