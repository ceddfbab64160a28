"""Probes of reads in place: what a filter element read from the KCRS
array, and an input element read from the input's channel planes, cost a
plan against the same plan reading packed panels.

As the other loop-nest probes (:mod:`.loop_probes`), each times whole plans
on a small synthetic layer and divides the difference by the count the cost
model keeps for it (:class:`~cso.analysis.pricing.Traffic`).
"""

from __future__ import annotations

import dataclasses

from .. import pack_filters
from ..analysis import counts, tiles
from ..measure import fast_quarter_times, plan_program
from .loop_probes import FILTER_LAYER, MIN_SECONDS, call_over_packed, layer_operands, layer_plan

# Filters read in place on a 1x1 layer: rows 4 KiB apart (1024 channels),
# ResNet-50's `l3 1x1 1024->256 @14`.  On an AMD EPYC (Zen 3) a read cost
# the 6 x 16 kernel 26-45 ps there against 4 on FILTER_LAYER.
POINTWISE_IN_PLACE_LAYER = ((1, 1024, 14, 14), (256, 1024, 1, 1), 1, 0)

# Input read in place: channel rows 784 bytes apart.  A read costs more as
# a tile's rows outgrow the L1 (each brings whole lines for Nwin elements,
# again on every reuse): on an AMD EPYC (Zen 3) the shapes' median read
# 10-15 ps with 256 channels, 62-90 with 1024, 70-111 with 2048 of 7x7.
IN_PLACE_INPUT_LAYER = POINTWISE_IN_PLACE_LAYER


def in_place_shapes(hardware) -> list:
    """The offered window-vectorised shapes ``(Nf, Nwin)`` whose filter rows,
    as :data:`FILTER_LAYER` lays them out, overflow no L1 set (their reads
    in place conflict in none: conflicts are priced apart), or the smallest.

    Not "``Nf`` at most the L1's ways": the 16 x 16 kernel (16 rows, a
    12-way L1) was then never measured and took the median's cost, where
    its reads in place cost it a third of its speed on a Xeon."""
    shapes = tiles.register_blocks(hardware.vector_bytes, hardware.vector_registers, 4)
    _, (_, channels, kernel_height, kernel_width), _, _ = FILTER_LAYER
    sets = hardware.l1_bytes // (hardware.line_bytes * hardware.l1_ways)
    fitting = [
        shape
        for shape in shapes
        if counts.rows_per_l1_set(
            shape[0], channels * kernel_height * kernel_width * 4, hardware.line_bytes, sets
        )
        <= hardware.l1_ways
    ]
    return fitting or [min(shapes)]


def in_place_filter_seconds(
    hardware, shape, rounds=5, times=fast_quarter_times, layer=FILTER_LAYER
) -> float:
    """Per filter element: ``layer`` (:data:`FILTER_LAYER` or
    :data:`POINTWISE_IN_PLACE_LAYER`) through a window-vectorised
    plan of ``shape`` (``(Nf, Nwin)``, :func:`in_place_shapes`), reading its
    filters in place, less the same plan reading them packed ahead (0 when
    it is not slower).

    No threshold: the difference is 0-4% of the layer, and on a shared
    Xeon eight measurements of the 8 x 48 kernel's gave 1-9 units (8 x 32:
    6-13); zeroing those under 2% of the layer made the median jump
    between 0 and 7 units from one calibration to the next, and with it
    29 of ResNet-50's and VGG-16's 70 per-call plans.  The two plans' times
    are their fastest quarters' means (``times``,
    :func:`cso.measure.fast_quarter_times`), whose difference moves less
    than the best rounds' (:func:`cso.measure.best_times`;
    ``experiments/difference_estimators.py``).  The caller takes a median
    of several."""
    x, w = layer_operands(layer)
    nf, nwin = shape
    plan = layer_plan(
        layer, hardware, vector_operand="windows", windows_per_tile=nwin, filters_per_tile=nf
    )
    extra = call_over_packed(plan, layer, x, w, rounds, times)
    reads = plan.cost_of(plan.schedule).in_place_filter_reads
    return max(0.0, extra) / max(1, reads)


def in_place_input_seconds(hardware, shape, rounds=5, times=fast_quarter_times) -> float:
    """Per input element read: :data:`IN_PLACE_INPUT_LAYER` through a plan
    of ``shape`` (``(Nf, Nwin, operand)``) on filters packed ahead that
    reads its input in place, less the same plan reading packed panels,
    both without their packing (the ``no-pack`` variant: the panels hold
    what earlier calls left, the reads are what is timed), over the reads
    in place the model counts
    (:func:`~cso.analysis.counts.in_place_input_reads`); 0 when reading in
    place is not slower, or this machine's plan packs the layer's input.
    The packing itself is :func:`.loop_probes.input_pack_times`' pointwise kind."""
    x, w = layer_operands(IN_PLACE_INPUT_LAYER)
    x_shape, _, stride, padding = IN_PLACE_INPUT_LAYER
    nf, nwin, operand = shape
    plan = layer_plan(
        IN_PLACE_INPUT_LAYER, hardware, filters_per_tile=nf, windows_per_tile=nwin,
        vector_operand=operand, filters_prepacked=True,
    )  # fmt: skip
    reads = plan.cost_of(plan.schedule).in_place_input_reads
    if not plan.input_in_place or not reads:
        return 0.0
    packed = dataclasses.replace(plan, input_in_place=False, pack_channels_outer=True)
    panels = pack_filters(w, x_shape, stride=stride, padding=padding, plan=plan)
    programs = {
        "in place": plan_program(plan, x, w, variant="no-pack", prepacked=panels),
        "packed": plan_program(packed, x, w, variant="no-pack", prepacked=panels),
    }
    timed = times(programs, rounds, MIN_SECONDS)
    return max(0.0, timed["in place"] - timed["packed"]) / reads
