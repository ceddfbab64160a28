"""The tap algorithm families, depthwise and grouped: tiles, cost terms, plan.

A depthwise convolution (one input channel per group, ``K = m * C``) has a
reduction of only ``R*S`` taps: the dense outer-product kernel would spend
its registers on padding.  Instead each input channel is packed once
(:mod:`cso.packing.depthwise`) and the tap kernel
(:mod:`cso.microkernels.taps`) keeps a row segment of ``Nv`` output vectors
in registers while it applies every tap.  The layer is memory-bound: its
cost is the bytes it moves beside its multiply-adds and calls.

A grouped convolution with few channels per group (``C_g`` from 2 to
:data:`~cso.analysis.tap_rules.MAX_GROUP_CHANNELS`) runs the same way: the group's ``C_g`` channels
are packed once, one after another, and each call applies the ``C_g * R *
S`` taps of one filter.  The dense kernel would pack every window ``R*S``
times for only ``K_g`` filters to read (a 3x3 layer of 8 channels a group
spent 62% of its time packing); here each input element is packed once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from . import counts, tap_rules, tiles
from .choices import Algorithm, Schedule, VectorOperand
from .pricing import Traffic, weighted_cost
from .hardware import Hardware
from .plan import Plan
from .tap_layout import (
    kernel_columns,
    kernel_shape,
    packed_channel_elements,
    rows_read,
)
from .ties import first_within


def is_depthwise(geometry: ConvGeometry) -> bool:
    """One input channel per group, more than one group: ``groups == C``."""
    return geometry.channels_per_group == 1 and geometry.groups > 1


def tap_algorithm(geometry: ConvGeometry):
    """The tap family that can run ``geometry``: ``DEPTHWISE``, ``GROUPED`` or None."""
    if is_depthwise(geometry):
        return Algorithm.DEPTHWISE
    if tap_rules.is_small_grouped(geometry):
        return Algorithm.GROUPED
    return None


def even_split(extent: int, largest: int) -> int:
    """``ceil(extent / ceil(extent / largest))``: as few blocks of at most
    ``largest`` as cover ``extent``, evenly (56 rows by at most 16: 4 of 14)."""
    blocks = ceil_div(max(1, extent), largest)
    return ceil_div(max(1, extent), blocks)


def masked_rows(geometry: ConvGeometry, segment: int, rows_per_call: int) -> int:
    """The tap kernel's last rows that store part of their vectors: none when
    a row is at least one segment wide (a row's last segment then starts
    early enough to end at the edge, overlapping the one before); else
    ``min(rows, ceil((seg - Q) / Q))``, the rows whose whole vectors could
    run on past the plane (the others run on into the rows after them,
    stored later: :mod:`cso.microkernels.taps`)."""
    q = geometry.out_width
    if q >= segment:
        return 0
    return min(rows_per_call, ceil_div(segment - q, q))


def filter_options(geometry: ConvGeometry) -> list:
    """Filters a tap-kernel call may hold, ``F``: the powers of two that
    divide the group's ``m`` filters (1 alone for a depthwise layer of
    multiplier 1).  The registers bound them further
    (:func:`~cso.analysis.tap_rules.max_rows_per_call`)."""
    m = geometry.filters_per_group
    return [1 << i for i in range(m.bit_length()) if m % (1 << i) == 0]


def kernel_options(geometry: ConvGeometry, lanes: int, vector_registers: int) -> list:
    """``[(rows_per_call, segment, filters_per_call)]`` the analysis weighs
    for a tap layer.

    Segments of ``v`` vectors for ``v`` from 1 to
    :data:`~cso.analysis.tap_rules.MAX_SEGMENT_VECTORS`
    and no wider than a row (one vector when a row is narrower than that);
    for each, and each ``F`` of :func:`filter_options` whose ``F * v``
    accumulators fit (:func:`~cso.analysis.tap_rules.max_rows_per_call`), the
    one-row kernel and, where :func:`~cso.analysis.tap_rules.offers_row_blocks`,
    a block of as many rows as the registers hold without spilling
    (:func:`~cso.analysis.tap_rules.max_tap_rows`), split evenly down the
    plane.  Each loaded input vector feeds ``F`` filters: a grouped layer's
    ``m`` filters share the loads its one-filter kernel repeats ``m`` times.
    """
    g = geometry
    options = []
    for vectors in range(1, max(1, min(tap_rules.MAX_SEGMENT_VECTORS, g.out_width // lanes)) + 1):
        for filters in filter_options(g):
            if tap_rules.max_rows_per_call(vectors, 1, vector_registers, filters) < 1:
                continue
            options.append((1, vectors * lanes, filters))
            if tap_rules.offers_row_blocks(g):
                largest = tap_rules.max_tap_rows(
                    vectors, g.kernel_height, vector_registers, filters, g.stride_h,
                    g.dilation_h,
                )
                rows = even_split(g.out_height, largest) if largest else 1
                if rows > 1:
                    options.append((rows, vectors * lanes, filters))
    return options


def kernel_loads(
    geometry: ConvGeometry, rows_per_call: int, segment: int, lanes: int, filters: int = 1
) -> int:
    """Vector loads of one call: its block's input rows (1 for the one-row
    kernel) times its columns times ``Nv``, and the ``(F - 1) * R_k`` weight
    broadcasts a column adds past one filter's (``R_k`` the kernel's rows of
    taps: ``R``, or 1 for the one-row kernel).  The first filter's
    broadcasts are in the per-load time the calibration measures, on the
    one-filter kernel."""
    g = geometry
    height, stride_h, dilation_h = kernel_shape(g, rows_per_call)
    block_rows = rows_read(rows_per_call, height, stride_h, dilation_h)
    columns = kernel_columns(g, rows_per_call)
    return block_rows * columns * (segment // lanes) + (filters - 1) * height * columns


def tap_kernel_cost(
    weights, element_bytes: int, calls: int, macs: int, loads: int, vector_bytes: int,
    call_cost=None, load_cost=None,
) -> float:  # fmt: skip
    """``calls * c_call + macs * c_mac * s/4 + loads * c_load``, where
    ``c_load`` is ``load_cost`` when given and not 0, else ``max(0, c_tap_load
    - (vector_bytes/4) * c_mac)``, and ``c_call`` is ``call_cost``, or
    ``tap_call_cost`` when None.

    ``c_tap_load`` is measured on the one-row tap kernel, which issues a
    vector load beside each vector FMA: it is the pair's time, and ``c_load``
    the load's own share once the FMA's is taken out.  The FMAs and the
    loads are summed, not overlapped: on the Xeon (Sapphire Rapids,
    L1-resident operands) 9 unaligned loads and 9 FMAs an output vector
    took 2.4x the FMAs' time, 3 and 9 1.4x, 1 and 9 1.0x, and row-kernel
    calls of 4 x 4, 14 x 2 and 7 x 1 vectors of 3x3 taps ran within 6% of
    this sum (45.6, 70 and 19.3 ns against 47.5, 72 and 20.5), where the
    larger of the two gave half their time.
    """
    if not load_cost:
        fma_cost = weights.mac_cost * vector_bytes / 4
        load_cost = max(0.0, weights.tap_load_cost - fma_cost)
    macs_cost = macs * weights.mac_cost * element_bytes / 4
    if call_cost is None:
        call_cost = weights.tap_call_cost
    return calls * call_cost + macs_cost + loads * load_cost


def depthwise_traffic(
    geometry: ConvGeometry,
    hardware: Hardware,
    element_bytes: int,
    segment: int,
    threads: int,
    rows_per_call: int = 1,
    filters_per_call: int = 1,
) -> Traffic:
    """What one (group, image) job of the tap nest costs, modelled.

    Counts per job: the compulsory bytes (its ``C_g`` input planes, ``m``
    filters and ``m`` output planes) from the level the whole call's
    operands fit in; its ``C_g`` packed channels' elements; ``(m / F) *
    ceil(P / rows) * ceil(Q / seg)`` kernel calls of ``F * rows * seg * C_g
    * R * S`` multiply-adds and :func:`kernel_loads` vector loads each.  The
    bytes and packing are weighted like the dense plans'
    (:func:`~cso.analysis.pricing.weighted_cost`);
    a call costs its FMAs' and its loads' times, summed
    (:func:`tap_kernel_cost`).  All scaled by the
    busiest thread's share of the ``N * G`` jobs.
    """
    g = geometry
    s = element_bytes
    lanes = max(1, hardware.vector_bytes // s)
    multiplier = g.filters_per_group
    taps = g.channels_per_group * g.kernel_height * g.kernel_width
    calls = (
        multiplier
        // filters_per_call
        * ceil_div(g.out_height, rows_per_call)
        * ceil_div(g.out_width, segment)
    )
    job_bytes = (
        g.channels_per_group * g.height * g.width + multiplier * taps + multiplier * g.windows
    ) * s
    return job_traffic(
        hardware,
        s,
        threads,
        jobs=g.batch * g.groups,
        job_bytes=job_bytes,
        calls=calls,
        macs=calls * filters_per_call * rows_per_call * segment * taps,
        loads=calls * kernel_loads(g, rows_per_call, segment, lanes, filters_per_call),
        # Priced as the whole packed channel, though a stride-1 job writes only
        # packed_channel_writes: priced at those, the model took the tap plan
        # for EfficientNet-B0's dw 5x5 480 @14 and 672 @14, where it ran 1.5x
        # slower than the lane plan (75.9 and 102.9 us against 49.2 and 65.6,
        # one thread, Xeon): the tap block kernel runs at about half the rate
        # tap_kernel_cost gives it (139 cycles against 61 a 3x3 call of 14 rows).
        packed_elements=g.channels_per_group * packed_channel_elements(g, segment, lanes),
        # Its calls as measured in the tap nest, where calibrated.
        call_cost=hardware.weights.tap_nest_call_cost or None,
    )


def job_traffic(
    hardware: Hardware,
    element_bytes: int,
    threads: int,
    *,
    jobs: int,
    job_bytes: int,
    calls: int,
    macs: int,
    loads: int,
    packed_elements: int,
    input_pack_cost=None,
    call_cost=None,
    load_cost=None,
    job_cost=0.0,
) -> Traffic:
    """One job of a tap-kernel family's nest (tap or lane), modelled from its counts.

    ``job_bytes`` compulsory bytes from the level all ``jobs`` jobs'
    operands fit in; ``packed_elements`` weighted like the dense plans'
    input packing (at ``input_pack_cost`` if given); ``calls`` kernel calls
    (at ``call_cost`` each if given) of ``macs`` multiply-adds and ``loads``
    vector loads in all (at ``load_cost`` each if given and not 0), priced by
    :func:`tap_kernel_cost` (not the outer-product kernel's weights), and
    the job's own ``job_cost``.  The cost is scaled by the busiest thread's
    share of the jobs.
    """
    level = counts.level_of(
        job_bytes * jobs,
        tiles.usable_bytes(hardware.l2_bytes, hardware.usable_fraction),
        tiles.usable_bytes(hardware.l3_bytes, hardware.usable_fraction),
    )
    job_counts = dict(
        dram=job_bytes if level == "dram" else 0,
        l3=job_bytes if level == "l3" else 0,
        l2=job_bytes,
        tlb_misses=0,
        kernel_calls=calls,
        l1_spill=0,
        padded_macs=macs,
        packed_input_elements=packed_elements,
        tap_loads=loads,
    )
    dense_counts = {name: n for name, n in job_counts.items() if name != "tap_loads"}
    weighted = weighted_cost(
        hardware,
        element_bytes,
        **dict(dense_counts, kernel_calls=0, padded_macs=0),
        shared=threads > 1,
        input_pack_cost=input_pack_cost,
    )
    weighted += job_cost + tap_kernel_cost(
        hardware.weights, element_bytes, calls, macs, loads, hardware.vector_bytes, call_cost,
        load_cost,
    )
    imbalance = counts.thread_imbalance(threads, jobs, 1, 1, 1.0)
    return Traffic(cost=imbalance * weighted, imbalance=imbalance, **job_counts)


def per_channel(job: Traffic, channels: int) -> Traffic:
    """A job of ``channels`` channels' (filters') traffic per channel: its
    cost divided by them, its counts too (rounded up), as the tap and dense
    plans are priced per group (the lane plans' jobs of ``VL`` channels, the
    row plans' of filters side by side)."""
    counts_each = {
        field.name: ceil_div(getattr(job, field.name), channels)
        for field in dataclasses.fields(job)
        if field.name not in ("cost", "imbalance")
    }
    return dataclasses.replace(job, cost=job.cost / channels, **counts_each)


def plan_depthwise(
    geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int,
    filters_prepacked: bool = False,
):  # fmt: skip
    """The tap plan of ``geometry`` (which must have a :func:`tap_algorithm`):
    depthwise, or grouped with few channels per group.  ``filters_prepacked``
    changes nothing: the family's packed filters are the KCRS rows."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    # Every (rows, segment) the kernel offers, priced; near-ties go to the
    # first offered (fewest vectors, the one-row kernel first), so that
    # calibrations a few percent apart plan alike.
    options = []
    for rows, segment, filters in kernel_options(geometry, lanes, hardware.vector_registers):
        traffic = depthwise_traffic(
            geometry, hardware, element_bytes, segment, threads, rows, filters
        )
        options.append((traffic.cost, (rows, segment, filters, traffic)))
    rows, segment, filters, traffic = first_within(options)
    return untiled_plan(
        geometry, dtype_name, hardware, threads, traffic, tap_algorithm(geometry), segment, rows,
        filters,
    )  # fmt: skip


def untiled_plan(
    geometry, dtype_name, hardware, threads, traffic, algorithm, windows_per_tile,
    rows_per_call=1, filters_per_tile=1, filters_prepacked=False,
) -> Plan:  # fmt: skip
    """A plan of a family with no cache tiles (tap, lane, plane, row,
    Winograd): its kernel's ``filters_per_tile x windows_per_tile`` and
    ``rows_per_call``, the dense tiles 1, ``traffic`` for both schedules
    (neither applies) and whether it was priced for filters packed ahead."""
    return Plan(
        schedule=Schedule.IS,
        channel_tile=1,
        l2_tiles=1,
        l3_tiles=1,
        filters_per_tile=filters_per_tile,
        windows_per_tile=windows_per_tile,
        dtype=dtype_name,
        vector_lanes=max(1, hardware.vector_bytes // np.dtype(dtype_name).itemsize),
        threads=int(threads),
        window_parts=1,
        input_in_place=False,
        costs=((Schedule.IS, traffic), (Schedule.WS, traffic)),
        tiles_by_schedule=((Schedule.IS, (1, 1, 1)), (Schedule.WS, (1, 1, 1))),
        geometry=geometry,
        hardware=hardware,
        vector_operand=VectorOperand.WINDOWS,
        algorithm=algorithm,
        rows_per_call=rows_per_call,
        filters_prepacked=bool(filters_prepacked),
    )
