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
from . import cost, tiles
from .choices import Algorithm, Schedule, VectorOperand
from .cost import Traffic
from .hardware import Hardware
from .plan import Plan

# Accumulator vectors of the tap kernel at most (tiles.depthwise_segment_vectors).
MAX_SEGMENT_VECTORS = 4


def is_depthwise(geometry: ConvGeometry) -> bool:
    """One input channel per group, more than one group: ``groups == C``."""
    return geometry.channels_per_group == 1 and geometry.groups > 1


def packed_rows(geometry: ConvGeometry) -> int:
    """Input rows one output plane reads: ``(P - 1) * stride_h + (R - 1) * dilation_h + 1``."""
    g = geometry
    return (g.out_height - 1) * g.stride_h + (g.kernel_height - 1) * g.dilation_h + 1


def phase_width(geometry: ConvGeometry, segment: int) -> int:
    """Elements per packed row of each phase: ``ceil(Q / seg) * seg + ((S-1) * dw) // sw``,
    so that every load of the last, padded segment is inside the packed row."""
    g = geometry
    return (
        ceil_div(g.out_width, segment) * segment + (g.kernel_width - 1) * g.dilation_w // g.stride_w
    )


def packed_channel_elements(geometry: ConvGeometry, segment: int) -> int:
    """One packed channel: ``stride_w`` phases of ``rows x phase_width``."""
    return geometry.stride_w * packed_rows(geometry) * phase_width(geometry, segment)


def tap_offsets(geometry: ConvGeometry, segment: int) -> list:
    """Tap ``t = r*S + s``'s start in the packed channel relative to its output:
    ``phase(s) * rows * width + r * dilation_h * width + (s * dilation_w) // stride_w``."""
    g = geometry
    rows, width = packed_rows(g), phase_width(g, segment)
    return [
        (s * g.dilation_w % g.stride_w) * rows * width
        + r * g.dilation_h * width
        + s * g.dilation_w // g.stride_w
        for r in range(g.kernel_height)
        for s in range(g.kernel_width)
    ]


def depthwise_traffic(
    geometry: ConvGeometry, hardware: Hardware, element_bytes: int, segment: int, threads: int
) -> Traffic:
    """What one (channel, image) job of the depthwise nest costs, modelled.

    Counts per job: the compulsory bytes (its input plane, ``m`` filters and
    ``m`` output planes) from the level the whole call's operands fit in;
    the packed channel's elements; ``m * P * ceil(Q / seg)`` kernel calls of
    ``seg * R * S`` multiply-adds each.  Weighted like the dense plans
    (:func:`~cso.analysis.cost.weighted_cost`, the calls at
    ``tap_call_cost``), scaled by the busiest thread's share of the
    ``N * C`` jobs.
    """
    g = geometry
    s = element_bytes
    multiplier = g.filters_per_group
    taps = g.kernel_height * g.kernel_width
    calls = multiplier * g.out_height * ceil_div(g.out_width, segment)
    job_bytes = (g.height * g.width + multiplier * taps + multiplier * g.windows) * s
    call_bytes = job_bytes * g.groups * g.batch
    usable = hardware.usable_fraction
    level = cost.level_of(
        call_bytes,
        tiles.usable_bytes(hardware.l2_bytes, usable),
        tiles.usable_bytes(hardware.l3_bytes, usable),
    )
    counts = dict(
        dram=job_bytes if level == "dram" else 0,
        l3=job_bytes if level == "l3" else 0,
        l2=job_bytes,
        tlb_misses=0,
        kernel_calls=calls,
        l1_spill=0,
        padded_macs=calls * segment * taps,
        packed_input_elements=packed_channel_elements(g, segment),
    )
    jobs = g.batch * g.groups
    imbalance = cost.thread_imbalance(threads, jobs, 1, 1, 1.0)
    weights = hardware.weights
    # The tap kernel's calls are not the outer-product kernel's: priced apart.
    weighted = cost.weighted_cost(hardware, s, **dict(counts, kernel_calls=0))
    weighted += calls * weights.tap_call_cost
    return Traffic(cost=imbalance * weighted, imbalance=imbalance, **counts)


def plan_depthwise(geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int):
    """The depthwise plan of ``geometry`` (which must be :func:`is_depthwise`)."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    vectors = tiles.depthwise_segment_vectors(geometry.out_width, lanes, MAX_SEGMENT_VECTORS)
    segment = vectors * lanes
    traffic = depthwise_traffic(geometry, hardware, element_bytes, segment, threads)
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
    )
