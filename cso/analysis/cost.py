"""The analytic cost model: the counts of :mod:`.counts`, weighed into one cost per schedule.

Counts are per (group, image), summed over all channel tiles, and read
straight off the loop nests in :mod:`cso.macrokernel.loops`.  A plan that
folds the batch into the windows works on one window space of ``N*P*Q``
windows: its counts are taken over that space and divided by ``N``, so that
both ways compare per image.  Notation:
``T_w = ceil(P*Q / Nwin)`` window tiles (``ceil(N*P*Q / Nwin)`` folded),
``T_f = ceil(K/Nf)`` filter tiles, ``T_c = ceil(C/Nc)`` channel tiles, ``IN_all = C*R*S*Nwin*s`` and
``FS_all = C*R*S*Nf*s`` (a tile's panels over all channel tiles),
``OUT = Nwin*Nf*s`` and ``RAW = C*H*W*s`` (the unpacked input).

Input-stationary (IS)::

    for c0 in T_c channel tiles
      for wb in B_w = ceil(T_w/K3) blocks:   pack K3 input tiles    (L3-resident)
        for fb in B_f = ceil(T_f/K2) blocks:                         (K2 filter tiles in L2)
          for w in K3 tiles: for f in K2 tiles: kernel

Weight-stationary (WS)::

    for c0 in T_c channel tiles
      for fb in B_f = ceil(T_f/K3) blocks:                           (K3 filter tiles in L3)
        for wb in B_w = ceil(T_w/K2) blocks: pack K2 input tiles    (L2-resident)
          for f in K3 tiles: for w in K2 tiles: kernel

The register-level work is the padded multiply-adds (equal for both
schedules; it tells micro-kernel shapes apart).  Around it are counted: bytes
per level, the data-TLB misses of the output writes, the micro-kernel calls
(each has a fixed cost: the output tile's write-back, operand streams
restarting) and the bytes of the stationary tile that must come from L2 on
every call when it does not fit in L1 beside the output tile.

The innermost loop of IS moves to another filter tile at every call, so
consecutive calls write ``Nf`` *other* output rows; when a row is a page or
longer and the ``K2`` tiles' rows outnumber the TLB, every call misses on
each of its rows.  WS's innermost loop walks along
the same ``Nf`` rows, missing only where a row crosses into a new page.
(Measured here on ResNet-50's 56x56 layers: IS up to 25% slower than WS with
equal byte counts, and not at all on 7x7 and 14x14 layers.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..geometry import ceil_div
from .choices import Schedule, VectorOperand
from .counts import (
    level_of,
    compulsory_bytes,
    partial_sum_bytes,
    is_filter_stream_bytes,
    is_input_reload_bytes,
    ws_raw_input_bytes,
    ws_filter_reload_bytes,
    kernel_operand_bytes,
    packed_write_bytes,
    output_pages_per_tile,
    output_tlb_misses,
    kernel_calls,
    l1_spill_bytes,
    padded_macs,
    transposed_stores,
    packed_filter_elements,
    packed_filter_memory_bytes,
    l3_resident_bytes,
    packed_input_elements,
    in_place_filter_reads,
    rows_per_l1_set,
    conflicting_filter_reads,
    thread_imbalance,
    largest_job_share,
)
from .tiles import conflict_probe_shape, packs_filters_in_nest
from .weights import kernel_shape_key


@dataclass(frozen=True)
class Traffic:
    """Bytes read from each level by one schedule, TLB misses, and their weighted cost.

    ``cost`` is the weighted sum of the counts (:func:`weighted_cost`) times
    ``imbalance`` (:func:`thread_imbalance`): what the busiest thread does,
    scaled to the whole problem, so that plans for any thread count compare.
    ``streamed_l3`` and ``streamed_dram`` are the part of ``l3`` and ``dram``
    that WS's micro-kernels read while they compute: the filter tiles,
    reloaded for every window block (:func:`hidden_stream_cost`).
    ``panel_memory`` is the part of ``dram`` between the filter panels a
    call packs and memory (:func:`~.counts.packed_filter_memory_bytes`).
    """

    dram: int
    l3: int
    l2: int
    tlb_misses: int
    kernel_calls: int
    l1_spill: int
    padded_macs: int
    cost: float
    transposed_stores: int = 0
    packed_filter_elements: int = 0
    packed_input_elements: int = 0
    in_place_filter_reads: int = 0
    conflicting_filter_reads: int = 0
    imbalance: float = 1.0
    streamed_l3: int = 0
    streamed_dram: int = 0
    tap_loads: int = 0
    panel_memory: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def far_level_costs(weights, shared: bool) -> tuple:
    """``(c_L3, c_DRAM)``: the one-core figures, or with ``shared`` (a plan
    for more than one thread, every core streaming at once) the shared ones."""
    if shared:
        return weights.l3_shared_cost, weights.dram_shared_cost
    return weights.l3_cost, weights.dram_cost


def workers_read_every_panel(threads: int, schedule, window_parts: int) -> bool:
    """Whether a plan's workers each read every filter panel: more than one
    thread, and IS or WS with its window tiles split into parts (WS workers
    otherwise read only the filter blocks they own)."""
    return threads > 1 and not (schedule == Schedule.WS and window_parts == 1)


def filter_pack_cost_for(
    weights, threads: int, schedule, window_parts: int, in_nest: bool = False
) -> float:
    """``c_pack``: ``filter_tile_pack_cost`` when the loop nest packs each
    tile just before use (``in_nest``,
    :func:`~cso.analysis.tiles.packs_filters_in_nest`);
    ``filter_pack_shared_cost`` when the workers each read every panel
    (:func:`workers_read_every_panel`: the panels are packed in a parallel
    pass, half of them on the other core); else ``filter_pack_cost``."""
    if in_nest:
        return weights.filter_tile_pack_cost
    if workers_read_every_panel(threads, schedule, window_parts):
        return weights.filter_pack_shared_cost
    return weights.filter_pack_cost


def hidden_stream_cost(
    hardware, element_bytes, *, streamed_dram, streamed_l3, padded_macs, shared=False,
    mac_cost=None,
) -> float:
    """``stream_overlap * min(streamed_dram*c_dram + streamed_l3*c_l3,
    macs*c_mac*s/4)``: the cost of WS's filter stream that runs while the
    FMAs do, taken off the sum of the two.

    WS's micro-kernels read each filter tile along its depth from L3 (or
    DRAM) once per window block; hardware prefetch brings it in while they
    compute, a few bytes per cycle.  Summed with the FMAs, this stream made
    two threads split a 3x3 layer's filters (each thread packing the whole
    input) rather than its windows (each streaming all the filters), which
    measured 1.07-1.10x faster.  What packing reads and writes runs between
    the calls and is not hidden; IS's streams are not credited either
    (measured: crediting them picked IS where WS ran faster).  ``mac_cost``:
    the micro-kernel shape's ``c_mac`` (default ``CostWeights.mac_cost``).
    """
    l3_cost, dram_cost = far_level_costs(hardware.weights, shared)
    mac_cost = hardware.weights.mac_cost if mac_cost is None else mac_cost
    streams = streamed_dram * dram_cost + streamed_l3 * l3_cost
    compute = padded_macs * mac_cost * element_bytes / 4
    return hardware.weights.stream_overlap * min(streams, compute)


def weighted_cost(
    hardware,
    element_bytes,
    *,
    dram,
    l3,
    l2,
    tlb_misses,
    kernel_calls,
    l1_spill,
    padded_macs,
    transposed_stores=0,
    packed_filter_elements=0,
    packed_input_elements=0,
    in_place_filter_reads=0,
    conflicting_filter_reads=0,
    streamed_l3=0,
    streamed_dram=0,
    shared=False,
    mac_cost=None,
    in_place_cost=None,
    input_pack_cost=None,
    filter_pack_cost=None,
):
    """``dram*c_dram + l3*c_l3 + l2*c_l2 + misses*c_tlb + calls*c_call
    + spill*c_spill + macs*c_mac*s/4 + stores*c_store + packed*c_pack
    + inputs*c_input + reads*c_in_place + conflicts*c_conflict - hidden``
    (a float64 MAC takes two float32
    lanes; ``stores`` are transposed element stores, ``packed`` filter
    elements packed in the call, ``inputs`` input elements packed into
    panels, ``reads`` filter elements read in place, ``conflicts`` those of
    them whose line L1 associativity evicted (:func:`conflicting_filter_reads`), ``hidden`` the
    streams' overlap with the FMAs, :func:`hidden_stream_cost`).  The counts
    are named as :class:`Traffic`'s fields; ``shared`` prices L3 and DRAM
    at their shared rates (:func:`far_level_costs`); ``mac_cost`` is the
    micro-kernel shape's ``c_mac`` (``CostWeights.mac_cost_of``; default
    ``CostWeights.mac_cost``), ``in_place_cost`` its ``c_in_place``
    (``CostWeights.in_place_cost_of``; default ``in_place_filter_cost``),
    ``input_pack_cost`` the layer's packing kind's ``c_input``
    (``CostWeights.input_pack_cost_of``; default ``input_pack_cost``),
    ``filter_pack_cost`` the plan's ``c_pack`` (:func:`filter_pack_cost_for`;
    default ``CostWeights.filter_pack_cost``)."""
    l3_cost, dram_cost = far_level_costs(hardware.weights, shared)
    mac_cost = hardware.weights.mac_cost if mac_cost is None else mac_cost
    if in_place_cost is None:
        in_place_cost = hardware.weights.in_place_filter_cost
    if input_pack_cost is None:
        input_pack_cost = hardware.weights.input_pack_cost
    if filter_pack_cost is None:
        filter_pack_cost = hardware.weights.filter_pack_cost
    return (
        in_place_filter_reads * in_place_cost
        + conflicting_filter_reads * hardware.weights.l1_conflict_cost
        + transposed_stores * hardware.weights.transposed_store_cost
        + packed_filter_elements * filter_pack_cost
        + packed_input_elements * input_pack_cost
        + dram * dram_cost
        + l3 * l3_cost
        + l2 * hardware.weights.l2_cost
        + tlb_misses * hardware.weights.tlb_miss_cost
        + kernel_calls * hardware.weights.call_cost
        + l1_spill * hardware.weights.l1_miss_cost
        + padded_macs * mac_cost * element_bytes / 4
        - hidden_stream_cost(
            hardware,
            element_bytes,
            streamed_dram=streamed_dram,
            streamed_l3=streamed_l3,
            padded_macs=padded_macs,
            shared=shared,
            mac_cost=mac_cost,
        )
    )


def _conflict_probe_rows(hardware):
    """The filter rows the calibration's L1-conflict probe shares one set
    among on ``hardware`` (:func:`~cso.analysis.tiles.conflict_probe_shape`),
    or None."""
    shape = conflict_probe_shape(hardware.vector_bytes, hardware.vector_registers, hardware.l1_ways)
    return None if shape is None else shape[0]


def schedule_traffic(
    schedule: str,
    *,
    channels: int,
    kernel_area: int,
    height: int,
    width: int,
    filters: int,
    windows: int,
    channel_tile: int,
    filters_per_tile: int,
    windows_per_tile: int,
    k2: int,
    k3: int,
    element_bytes: int,
    hardware,
    window_parts: int = 1,
    vector_operand: VectorOperand = VectorOperand.WINDOWS,
    filters_prepacked: bool = False,
    batch: int = 1,
    input_in_place: bool = False,
    threads: int = 1,
    outer_jobs: int = 1,
    images: int = 1,
    input_pack_kind: str = None,
    out_width: int = None,
) -> Traffic:
    """Bytes per level and cost of one schedule, per (group, image).

    ``window_parts`` (WS) splits the window tiles into parallel parts; each
    part sweeps its own window blocks past every filter tile.
    ``vector_operand`` is the micro-kernel's orientation: the bytes are the
    same either way, the filter-vectorised kernel adds its transposed stores
    and, unless ``filters_prepacked``, the packing of every filter, shared by
    the ``batch`` images of the call.  ``input_in_place``: the kernel reads
    the input unpacked (no panels written).  ``threads`` and ``outer_jobs``
    (groups x images) weigh the cost by the busiest thread's share.
    ``images``: the images whose windows make one window space (``N`` when
    the batch is folded into the windows, else 1; ``windows`` stays one
    image's ``P*Q``); the counts over that space are divided by it.
    ``input_pack_kind`` (:func:`~cso.analysis.counts.input_pack_kind`)
    and the output width ``out_width`` pick the packed elements' weight
    (``CostWeights.input_pack_cost_of``).
    """
    l2_usable = int(hardware.l2_bytes * hardware.usable_fraction)
    l3_usable = int(hardware.l3_bytes * hardware.usable_fraction)
    s = element_bytes
    window_tiles = ceil_div(images * windows, windows_per_tile)
    filter_tiles = ceil_div(filters, filters_per_tile)
    channel_tiles = ceil_div(channels, channel_tile)
    input_all = channels * kernel_area * windows_per_tile * s
    filter_all = channels * kernel_area * filters_per_tile * s
    raw_input = images * channels * height * width * s
    out_tile = windows_per_tile * filters_per_tile * s
    all_filters = filter_tiles * filter_all
    all_outputs = images * filters * windows * s
    # Filters that fit in L3 come from DRAM once per call, whatever the batch:
    # each of the call's window spaces (N, or one folded) takes its share.
    shared_by = batch // images if all_filters <= l3_usable else 1
    levels = {
        "dram": compulsory_bytes(raw_input, all_filters // max(1, shared_by), all_outputs),
        "l3": 0,
        "l2": 0,
    }
    partials = partial_sum_bytes(channel_tiles, window_tiles, filter_tiles, out_tile)
    levels[level_of(all_outputs, l2_usable, l3_usable)] += partials
    filters_level = "l3" if all_filters <= l3_usable else "dram"
    # What the micro-kernels read from L3 or DRAM as they compute.
    kernel_streams = {"dram": 0, "l3": 0}
    if schedule == Schedule.IS:
        window_blocks = ceil_div(window_tiles, k3)
        filter_blocks = ceil_div(filter_tiles, k2)
        stationary_blocks = window_blocks
        levels[filters_level] += is_filter_stream_bytes(window_blocks, filter_tiles, filter_all)
        levels["l3"] += is_input_reload_bytes(filter_blocks, window_tiles, input_all)
        levels["l3"] += packed_write_bytes(1, window_tiles, input_all)
        levels["l2"] += kernel_operand_bytes(window_tiles, filter_tiles, filter_all)
    elif schedule == Schedule.WS:
        filter_blocks = ceil_div(filter_tiles, k3)
        stationary_blocks = filter_blocks
        window_blocks = window_parts * ceil_div(ceil_div(window_tiles, window_parts), k2)
        input_level = "l3" if raw_input <= l3_usable else "dram"
        levels[input_level] += ws_raw_input_bytes(filter_blocks, raw_input) - raw_input
        kernel_streams[filters_level] += ws_filter_reload_bytes(
            window_blocks, filter_tiles, filter_all
        )
        levels["l2"] += packed_write_bytes(filter_blocks, window_tiles, input_all)
        levels["l2"] += kernel_operand_bytes(window_tiles, filter_tiles, input_all)
    else:
        raise ValueError(f"schedule must be 'IS' or 'WS', got {schedule!r}")
    for level, count in kernel_streams.items():
        levels[level] += count
    packed_filters = packed_filter_elements(
        # One packing serves the call's window spaces: N, or one when folded.
        vector_operand, filters_prepacked, filter_tiles, filter_all, s, batch // images
    )
    in_nest = packs_filters_in_nest(
        schedule, vector_operand, filters_prepacked, window_parts, batch // images, k2,
        window_tiles,
    )  # fmt: skip
    # Workers that split the filter blocks each keep their share of the panels.
    panel_sharers = 1
    if not workers_read_every_panel(threads, schedule, window_parts):
        panel_sharers = max(1, min(threads, stationary_blocks))
    resident = l3_resident_bytes(hardware.l2_bytes, hardware.l3_bytes, hardware.cores)
    panel_memory = 0
    if not in_nest:  # packed tile by tile, the panels stay in one tile's buffer
        panel_memory = packed_filter_memory_bytes(packed_filters, s, resident, panel_sharers)
    levels["dram"] += panel_memory
    row_bytes = windows * s
    misses = output_tlb_misses(
        schedule,
        channel_tiles,
        window_tiles,
        filter_tiles,
        k2,
        output_pages_per_tile(filters_per_tile, row_bytes, hardware.page_bytes),
        ceil_div(all_outputs, hardware.page_bytes),
        hardware.tlb_entries,
    )
    calls = kernel_calls(channel_tiles, window_tiles, filter_tiles)
    # The stationary tile of the innermost loop, for the largest channel tile.
    depth = ceil_div(channels, channel_tiles) * kernel_area * s
    stationary = depth * (windows_per_tile if schedule == Schedule.IS else filters_per_tile)
    streamed = depth * (filters_per_tile if schedule == Schedule.IS else windows_per_tile)
    l1_usable = int(hardware.l1_bytes * hardware.usable_fraction)
    # The innermost loop runs over K2 tiles of the other operand (IS: filter
    # tiles; WS: window tiles), the stationary tile's reuse.
    reuse = min(k2, filter_tiles if schedule == Schedule.IS else window_tiles)
    spill = l1_spill_bytes(stationary, streamed, out_tile, l1_usable, calls, reuse)
    macs = padded_macs(
        window_tiles, windows_per_tile, filter_tiles, filters_per_tile, channels * kernel_area
    )
    in_place_reads = in_place_filter_reads(
        vector_operand, filters_prepacked, macs, windows_per_tile
    )
    l1_sets = hardware.l1_bytes // (hardware.line_bytes * hardware.l1_ways)
    busiest_set = rows_per_l1_set(
        filters_per_tile, channels * kernel_area * s, hardware.line_bytes, l1_sets
    )
    counts = dict(
        dram=levels["dram"],
        l3=levels["l3"],
        l2=levels["l2"],
        tlb_misses=misses,
        kernel_calls=calls,
        l1_spill=spill,
        padded_macs=macs,
        transposed_stores=transposed_stores(
            vector_operand, calls, filters_per_tile * windows_per_tile
        ),
        packed_filter_elements=packed_filters,
        packed_input_elements=packed_input_elements(
            schedule, input_in_place, filter_blocks, window_tiles, input_all, s,
            windows_per_tile, max(1, hardware.vector_bytes // s),
        ),  # fmt: skip
        in_place_filter_reads=in_place_reads,
        conflicting_filter_reads=conflicting_filter_reads(
            in_place_reads, busiest_set, hardware.l1_ways, _conflict_probe_rows(hardware)
        ),
        streamed_l3=kernel_streams["l3"],
        streamed_dram=kernel_streams["dram"],
    )
    imbalance = thread_imbalance(
        threads,
        outer_jobs,
        stationary_blocks,
        window_parts if schedule == Schedule.WS else 1,
        largest_job_share(schedule, window_tiles, filter_tiles, k3, window_parts),
    )
    shape = kernel_shape_key(filters_per_tile, windows_per_tile, vector_operand)
    shape_costs = dict(
        mac_cost=hardware.weights.mac_cost_of(shape, pointwise=kernel_area == 1),
        in_place_cost=hardware.weights.in_place_cost_of(shape),
        input_pack_cost=hardware.weights.input_pack_cost_of(input_pack_kind, out_width),
        filter_pack_cost=filter_pack_cost_for(
            hardware.weights, threads, schedule, window_parts, in_nest
        ),
    )
    cost = (
        imbalance * weighted_cost(hardware, s, **counts, shared=threads > 1, **shape_costs) / images
    )
    counts = {name: count // images for name, count in counts.items()}
    return Traffic(cost=cost, imbalance=imbalance, panel_memory=panel_memory // images, **counts)
