"""The depthwise algorithm family: its tiles, its cost terms and its plan.

A depthwise convolution (one input channel per group, ``K = m * C``) has a
reduction of only ``R*S`` taps: the dense outer-product kernel would spend
its registers on padding.  Instead each input channel is packed once
(:mod:`cso.packing.depthwise`) and the tap kernel
(:mod:`cso.microkernels.taps`) keeps a row segment of ``Nv`` output vectors
in registers while it applies every tap.  The layer is memory-bound: its
cost is the bytes it moves beside its multiply-adds and calls.
"""

from __future__ import annotations

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from . import cost, counts, tiles
from .choices import Algorithm, Schedule, VectorOperand
from .cost import Traffic
from .hardware import Hardware
from .plan import Plan

# Accumulator vectors of the tap kernel at most (tiles.depthwise_segment_vectors).
MAX_SEGMENT_VECTORS = tiles.MAX_SEGMENT_VECTORS


def is_depthwise(geometry: ConvGeometry) -> bool:
    """One input channel per group, more than one group: ``groups == C``."""
    return geometry.channels_per_group == 1 and geometry.groups > 1


def packed_rows(geometry: ConvGeometry) -> int:
    """Input rows one output plane reads: ``(P - 1) * stride_h + (R - 1) * dilation_h + 1``."""
    g = geometry
    return (g.out_height - 1) * g.stride_h + (g.kernel_height - 1) * g.dilation_h + 1


def phase_width(geometry: ConvGeometry, segment: int, spans_rows: bool = False) -> int:
    """Elements per packed row of each phase.

    Row by row: ``ceil(Q / seg) * seg + ((S-1) * dw) // sw``, so that every
    load of a row's last, padded segment is inside the packed row.  With
    segments spanning rows: ``Q + ((S-1) * dw) // sw``, the columns the
    outputs read (the extra ones are computed and dropped).
    """
    g = geometry
    reach = (g.kernel_width - 1) * g.dilation_w // g.stride_w
    if spans_rows:
        return g.out_width + reach
    return ceil_div(g.out_width, segment) * segment + reach


def packed_channel_elements(geometry: ConvGeometry, segment: int, spans_rows: bool = False) -> int:
    """One packed channel: ``stride_w`` phases of ``rows x phase_width``, and
    with segments spanning rows one segment more, which the last segment's
    loads may run into."""
    g = geometry
    elements = g.stride_w * packed_rows(g) * phase_width(g, segment, spans_rows)
    return elements + segment if spans_rows else elements


def spanned_outputs(geometry: ConvGeometry, segment: int) -> int:
    """Outputs one channel computes with segments spanning rows: ``(P-1) * width + Q``
    (``width`` the packed row's: each row's last ``width - Q`` are dropped)."""
    g = geometry
    return (g.out_height - 1) * phase_width(g, segment, True) + g.out_width


def span_scratch_elements(geometry: ConvGeometry, segment: int) -> int:
    """The scratch plane spanning segments are written to: whole segments."""
    return ceil_div(spanned_outputs(geometry, segment), segment) * segment


def tap_offsets(geometry: ConvGeometry, segment: int, spans_rows: bool = False) -> list:
    """Tap ``t = r*S + s``'s start in the packed channel relative to its output:
    ``phase(s) * rows * width + r * dilation_h * width + (s * dilation_w) // stride_w``."""
    g = geometry
    rows, width = packed_rows(g), phase_width(g, segment, spans_rows)
    return [
        (s * g.dilation_w % g.stride_w) * rows * width
        + r * g.dilation_h * width
        + s * g.dilation_w // g.stride_w
        for r in range(g.kernel_height)
        for s in range(g.kernel_width)
    ]


def depthwise_traffic(
    geometry: ConvGeometry,
    hardware: Hardware,
    element_bytes: int,
    segment: int,
    threads: int,
    spans_rows: bool = False,
) -> Traffic:
    """What one (channel, image) job of the depthwise nest costs, modelled.

    Counts per job: the compulsory bytes (its input plane, ``m`` filters and
    ``m`` output planes) from the level the whole call's operands fit in;
    the packed channel's elements; ``m * P * ceil(Q / seg)`` kernel calls of
    ``seg * R * S`` multiply-adds each, or with segments spanning rows
    ``m * ceil(((P-1) * width + Q) / seg)`` calls and the copy of every
    output out of the scratch plane (priced like packed elements).  Weighted like the dense plans
    (:func:`~cso.analysis.cost.weighted_cost`, the calls at
    ``tap_call_cost``), scaled by the busiest thread's share of the
    ``N * C`` jobs.
    """
    g = geometry
    s = element_bytes
    multiplier = g.filters_per_group
    taps = g.kernel_height * g.kernel_width
    if spans_rows:
        calls = multiplier * ceil_div(spanned_outputs(g, segment), segment)
        copied = multiplier * g.windows
    else:
        calls = multiplier * g.out_height * ceil_div(g.out_width, segment)
        copied = 0
    job_bytes = (g.height * g.width + multiplier * taps + multiplier * g.windows) * s
    call_bytes = job_bytes * g.groups * g.batch
    usable = hardware.usable_fraction
    level = counts.level_of(
        call_bytes,
        tiles.usable_bytes(hardware.l2_bytes, usable),
        tiles.usable_bytes(hardware.l3_bytes, usable),
    )
    job_counts = dict(
        dram=job_bytes if level == "dram" else 0,
        l3=job_bytes if level == "l3" else 0,
        l2=job_bytes,
        tlb_misses=0,
        kernel_calls=calls,
        l1_spill=0,
        padded_macs=calls * segment * taps,
        packed_input_elements=packed_channel_elements(g, segment, spans_rows) + copied,
    )
    jobs = g.batch * g.groups
    imbalance = counts.thread_imbalance(threads, jobs, 1, 1, 1.0)
    weights = hardware.weights
    # The tap kernel's calls are not the outer-product kernel's: priced apart.
    weighted = cost.weighted_cost(
        hardware, s, **dict(job_counts, kernel_calls=0), shared=threads > 1
    )
    weighted += calls * weights.tap_call_cost
    return Traffic(cost=imbalance * weighted, imbalance=imbalance, **job_counts)


def plan_depthwise(geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int):
    """The depthwise plan of ``geometry`` (which must be :func:`is_depthwise`)."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    # Row by row, or (stride 1 down the rows, whose packed rows are then
    # consecutive) segments spanning rows, whichever the model prices lower.
    options = []
    for spans in (False, True) if geometry.stride_h == 1 else (False,):
        width = (
            spanned_outputs(geometry, lanes * MAX_SEGMENT_VECTORS) if spans else geometry.out_width
        )
        vectors = tiles.depthwise_segment_vectors(width, lanes, MAX_SEGMENT_VECTORS)
        segment = vectors * lanes
        traffic = depthwise_traffic(geometry, hardware, element_bytes, segment, threads, spans)
        options.append((traffic.cost, spans, segment, traffic))
    _, spans, segment, traffic = min(options, key=lambda option: option[:2])
    return Plan(
        schedule=Schedule.IS,
        channel_tile=1,
        l2_tiles=1,
        l3_tiles=1,
        filters_per_tile=1,
        windows_per_tile=segment,
        dtype=dtype_name,
        vector_lanes=lanes,
        threads=int(threads),
        window_parts=1,
        input_in_place=False,
        costs=((Schedule.IS, traffic), (Schedule.WS, traffic)),
        tiles_by_schedule=((Schedule.IS, (1, 1, 1)), (Schedule.WS, (1, 1, 1))),
        geometry=geometry,
        hardware=hardware,
        vector_operand=VectorOperand.WINDOWS,
        algorithm=Algorithm.DEPTHWISE,
        segments_span_rows=spans,
    )
