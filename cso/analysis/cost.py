"""The dense schedules' cost: the counts of :mod:`.counts`, weighed into one
cost per schedule (by :func:`.pricing.weighted_cost`).

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

from ..geometry import ceil_div
from .choices import Schedule, VectorOperand
from .counts import (
    level_of,
    compulsory_bytes,
    partial_sum_bytes,
    is_filter_stream_bytes,
    is_input_reload_bytes,
    ws_raw_input_bytes,
    ws_filter_stream_bytes,
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
    in_place_input_reads,
    rows_per_l1_set,
    rows_share_one_l1_set,
    conflicting_filter_reads,
    thread_imbalance,
    largest_job_share,
)
from .pricing import (
    Traffic,
    filter_pack_cost_for,
    up_front_packing_cost,
    weighted_cost,
    workers_read_every_panel,
)
from .tiles import conflict_probe_shape, packs_filters_in_nest
from .shape_tables import kernel_shape_key


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
    compulsory_filters = all_filters // max(1, shared_by)
    levels = {
        "dram": compulsory_bytes(raw_input, compulsory_filters, all_outputs),
        "l3": 0,
        "l2": 0,
    }
    partials = partial_sum_bytes(channel_tiles, window_tiles, filter_tiles, out_tile)
    levels[level_of(all_outputs, l2_usable, l3_usable)] += partials
    filters_level = "l3" if all_filters <= l3_usable else "dram"
    # What the micro-kernels read from L3 or DRAM as they compute.
    kernel_streams = {"dram": 0, "l3": 0}
    in_nest = packs_filters_in_nest(
        schedule, vector_operand, filters_prepacked, window_parts, batch // images, k2,
        window_tiles,
    )  # fmt: skip
    packed_filters = packed_filter_elements(
        # One packing serves the call's window spaces: N, or one when folded.
        vector_operand, filters_prepacked, filter_tiles, filter_all, s, batch // images
    )
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
        # Workers of a call's window parts read the same filters at once: one
        # copy of the stream comes from the far level, the others with it.
        read_together = window_parts if threads > 1 else 1
        kernel_streams[filters_level] += ws_filter_stream_bytes(
            window_blocks // read_together,
            filter_tiles,
            filter_all,
            # With no packing pass, the kernels make the compulsory read.
            first_pass=0 if packed_filters else compulsory_filters,
            packed_in_nest=in_nest,
        )
        levels["l2"] += packed_write_bytes(filter_blocks, window_tiles, input_all)
        levels["l2"] += kernel_operand_bytes(window_tiles, filter_tiles, input_all)
    else:
        raise ValueError(f"schedule must be 'IS' or 'WS', got {schedule!r}")
    for level, count in kernel_streams.items():
        levels[level] += count
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
        in_place_input_reads=in_place_input_reads(
            input_in_place, vector_operand, filter_tiles, (images * windows) // windows_per_tile,
            windows_per_tile, channels * kernel_area,
        ),  # fmt: skip
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
        in_place_cost=hardware.weights.in_place_cost_of(
            shape, pointwise=rows_share_one_l1_set(kernel_area, filters_per_tile, busiest_set)
        ),
        input_pack_cost=hardware.weights.input_pack_cost_of(input_pack_kind, out_width),
        filter_pack_cost=filter_pack_cost_for(
            hardware.weights, threads, schedule, window_parts, in_nest
        ),
    )
    cost = (
        imbalance * weighted_cost(hardware, s, **counts, shared=threads > 1, **shape_costs) / images
    )
    if packed_filters and not in_nest:
        # Packed up front, once a call for its groups x images.
        cost += up_front_packing_cost(hardware.weights, threads, outer_jobs * images)
    counts = {name: count // images for name, count in counts.items()}
    return Traffic(cost=cost, imbalance=imbalance, panel_memory=panel_memory // images, **counts)
