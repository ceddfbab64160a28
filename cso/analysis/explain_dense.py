"""The story of a dense (outer-product) plan, for :func:`.explain.explain`:
its tiles against the caches, both schedules' modelled traffic and costs,
why it chose as it did, and its loop nest."""

from __future__ import annotations

import numpy as np

from ..geometry import ceil_div
from . import candidates, counts, tiles
from .choices import Schedule, VectorOperand
from .pricing import filter_pack_cost_for, hidden_stream_cost, workers_read_every_panel
from .explain_inputs import input_pack_cost, input_pack_story, input_way_story
from .explain_text import size_text, weights_origin
from .planner import plan_for_geometry
from .shape_tables import kernel_shape_key


def _occupancy(plan) -> list:
    """(level, bytes the schedule keeps there, usable bytes, capacity) per cache level."""
    g, hw = plan.geometry, plan.hardware
    s = np.dtype(plan.dtype).itemsize
    area = g.kernel_height * g.kernel_width
    in_b = tiles.input_tile_bytes(plan.channel_tile, area, plan.windows_per_tile, s)
    fs_b = tiles.filter_tile_bytes(plan.channel_tile, area, plan.filters_per_tile, s)
    out_b = tiles.output_tile_bytes(plan.windows_per_tile, plan.filters_per_tile, s)
    resident, streamed = (in_b, fs_b) if plan.schedule == Schedule.IS else (fs_b, in_b)
    # In L2 the input's panels sit beside the rows they are packed from.
    in_l2 = in_b + _source_bytes(plan)
    resident_l2, streamed_l2 = (in_l2, fs_b) if plan.schedule == Schedule.IS else (fs_b, in_l2)
    k2, k3 = plan.l2_tiles, plan.l3_tiles
    rows = [
        ("L1", in_b + fs_b + out_b, hw.l1_bytes),
        ("L2", resident_l2 + k2 * streamed_l2 + k2 * out_b, hw.l2_bytes),
        ("L3", k3 * resident + k2 * streamed + k2 * k3 * out_b, hw.l3_bytes),
    ]
    return [
        (
            name,
            used,
            tiles.usable_bytes(
                cap, hw.usable_fraction * (1.0 if name == "L1" else hw.weights.sweep_fraction)
            ),
            cap,
        )
        for name, used, cap in rows
    ]


def _source_bytes(plan) -> int:
    """``SRC`` of ``plan``'s input panel (:func:`candidates.packing_source_tile_bytes`)."""
    return candidates.packing_source_tile_bytes(
        candidates.problem_of(plan), plan.channel_tile, plan.windows_per_tile
    )


def _loop_nest(plan) -> str:
    g = plan.geometry
    nf, nwin, k2, k3 = plan.filters_per_tile, plan.windows_per_tile, plan.l2_tiles, plan.l3_tiles
    window_tiles = ceil_div(plan.window_count, nwin)
    filter_tiles = ceil_div(g.filters_per_group, nf)
    channel_tiles = ceil_div(g.channels_per_group, plan.channel_tile)
    depth = f"{plan.channel_tile}*{g.kernel_height}*{g.kernel_width}"
    images = (
        f"1 window run of {g.batch} image(s) folded" if plan.batch_folded else f"{g.batch} image(s)"
    )
    if plan.schedule == Schedule.IS:
        blocks = ceil_div(window_tiles, k3)
        return "\n".join(
            [
                f"parallel for job in {g.groups} group(s) x {images} x {blocks} window "
                f"block(s) of {k3} tiles:",
                f"  for c0 in {channel_tiles} channel tile(s) of <= {plan.channel_tile} channels "
                f"(of {g.channels_per_group}):",
                f"    pack {k3} input tiles [{depth}][{nwin}]      # the block, ~ L3",
                f"    for f0 in {ceil_div(filter_tiles, k2)} block(s) of {k2} filter tiles "
                f"(of {filter_tiles}):   # ~ L2",
                f"      for w in the {k3} input tiles:                     # one in L1",
                f"        for f in the {k2} filter tiles:",
                f"          micro-kernel {nf}x{nwin}: y[f*{nf}:+{nf}, w*{nwin}:+{nwin}] "
                f"(+)= FS(c0, f) x IN(c0, w)",
            ]
        )
    blocks = ceil_div(filter_tiles, k3)
    return "\n".join(
        [
            f"parallel for job in {g.groups} group(s) x {images} x {blocks} filter "
            f"block(s) of {k3} tiles x {plan.window_parts} window part(s):",
            f"  for c0 in {channel_tiles} channel tile(s) of <= {plan.channel_tile} channels "
            f"(of {g.channels_per_group}):",
            f"    for w0 in the part's {ceil_div(window_tiles, plan.window_parts)} window "
            f"tiles (of {window_tiles}), {k2} at a time:",
            f"      pack {k2} input tiles [{depth}][{nwin}]    # ~ L2",
            f"      for f in the {k3} filter tiles:                    # one in L1, all in L3",
        ]
        + (
            [f"        pack FS(c0, f) [{depth}][{nf}] from KCRS       # ~ L1/L2, once a call"]
            if plan.packs_filters_in_nest
            else []
        )
        + [
            f"        for w in the {k2} input tiles:",
            f"          micro-kernel {nf}x{nwin}: y[f*{nf}:+{nf}, w*{nwin}:+{nwin}] "
            f"(+)= FS(c0, f) x IN(c0, w)",
        ]
    )


def _hidden(traffic, plan) -> float:
    element_bytes = np.dtype(plan.dtype).itemsize
    return hidden_stream_cost(
        plan.hardware,
        element_bytes,
        streamed_dram=traffic.streamed_dram,
        streamed_l3=traffic.streamed_l3,
        padded_macs=traffic.padded_macs,
        shared=plan.threads > 1,
        mac_cost=kernel_mac_cost(plan),
    )


def kernel_mac_cost(plan) -> float:
    """``c_mac`` of the plan's micro-kernel shape (``CostWeights.mac_cost_of``,
    its 1x1 figure on a 1x1 layer)."""
    return plan.hardware.weights.mac_cost_of(_kernel_shape(plan), pointwise=_pointwise(plan))


def _kernel_shape(plan) -> str:
    return kernel_shape_key(plan.filters_per_tile, plan.windows_per_tile, plan.vector_operand)


def _pointwise(plan) -> bool:
    """Whether the plan's layer is 1x1 (its mac costs are the 1x1 ones)."""
    return plan.geometry.kernel_height * plan.geometry.kernel_width == 1


def _why(plan) -> str:
    costs = dict(plan.costs)
    other = Schedule.WS if plan.schedule == Schedule.IS else Schedule.IS
    chosen, rival = costs[plan.schedule], costs[other]
    if rival.cost == chosen.cost:
        return f"{plan.schedule}: both schedules cost the same; IS is the tie-break."
    hw = plan.hardware
    terms = {
        "DRAM traffic": (rival.dram - chosen.dram) * hw.weights.dram_cost,
        "L3 traffic": (rival.l3 - chosen.l3) * hw.weights.l3_cost,
        "L2 traffic": (rival.l2 - chosen.l2) * hw.weights.l2_cost,
        "TLB misses": (rival.tlb_misses - chosen.tlb_misses) * hw.weights.tlb_miss_cost,
        "micro-kernel calls": (rival.kernel_calls - chosen.kernel_calls) * hw.weights.call_cost,
        "L1 spill": (rival.l1_spill - chosen.l1_spill) * hw.weights.l1_miss_cost,
        "input packing": (rival.packed_input_elements - chosen.packed_input_elements)
        * input_pack_cost(plan),
        "streams hidden behind the FMAs": _hidden(chosen, plan) - _hidden(rival, plan),
        "thread balance": (rival.imbalance - chosen.imbalance) * chosen.cost / chosen.imbalance,
    }
    biggest = max(terms, key=lambda name: terms[name])
    share = 1 - chosen.cost / rival.cost if rival.cost else 0.0
    forced = "" if share >= 0 else " (forced: the model prefers the other)"
    return (
        f"{plan.schedule}{forced}: modelled cost {chosen.cost:.3g} against {other}'s "
        f"{rival.cost:.3g} ({share:+.1%}); the largest saving is in {biggest} "
        f"({terms[biggest]:.3g} cost units)."
    )


def _why_folded(plan) -> str:
    # The model's plan for the same micro-kernel, image by image.
    by_image = plan_for_geometry(
        plan.geometry,
        plan.dtype,
        plan.hardware,
        plan.filters_per_tile,
        plan.windows_per_tile,
        None,
        plan.threads,
        vector_operand=plan.vector_operand,
        filters_prepacked=plan.filters_prepacked,
        fold_batch=False,
    )
    folded, unfolded = plan.cost_of(plan.schedule), by_image.cost_of(by_image.schedule)
    return (
        f"batch folded: modelled cost {folded.cost:.3g} per image against {unfolded.cost:.3g} "
        f"image by image ({by_image.schedule}, {padding_share(by_image):.1%} padding)."
    )


def _filter_pack_story(plan) -> str:
    """What packing the filters in the call is priced at, when the plan does."""
    packed = plan.cost_of(plan.schedule).packed_filter_elements
    parts = (plan.threads, plan.schedule, plan.window_parts)
    in_nest = plan.packs_filters_in_nest
    price = f"{filter_pack_cost_for(plan.hardware.weights, *parts, in_nest):.3g}"
    if in_nest:
        price += (
            " (filter_tile_pack_cost: each tile packed in the loop nest just before its use, "
            "into one tile's buffer that stays in L1/L2, each once a call)"
        )
    elif workers_read_every_panel(*parts):
        price += ", shared: every worker reads every panel"
    if not packed:
        return ""
    story = f"filter packing in the call: {packed} elements at c_pack {price}"
    fixed = plan.hardware.weights.filter_pack_call_cost
    if fixed and not in_nest:
        story += f"; up front, fixed {fixed:.3g} a call (the calling thread; the others wait)"
    memory = plan.cost_of(plan.schedule).panel_memory
    if memory:
        story += (
            f"\n  its panels outgrow what stays in the L3 between calls: {memory / 2**20:.1f} MiB"
            " between them and DRAM (write-allocate and write-back)"
        )
    return story


def _mac_cost_story(plan) -> str:
    weights = plan.hardware.weights
    table = weights.mac_cost_table(_pointwise(plan))
    measured = any(name == _kernel_shape(plan) for name, _ in table)
    on_1x1 = _pointwise(plan) and weights.pointwise_mac_costs
    which = "this shape's on 1x1 layers" if on_1x1 else "this shape's"
    where = f"{which}, calibrated" if measured else "the weights' mac_cost"
    return f"c_mac {kernel_mac_cost(plan):.3g} ({where})"


def _in_place_cost_story(plan, row_bytes: int) -> str:
    """The cost of one filter read in place and which figure it is."""
    weights, hw = plan.hardware.weights, plan.hardware
    shape = _kernel_shape(plan)
    sets = hw.l1_bytes // (hw.line_bytes * hw.l1_ways)
    busiest = counts.rows_per_l1_set(plan.filters_per_tile, row_bytes, hw.line_bytes, sets)
    area = plan.geometry.kernel_height * plan.geometry.kernel_width
    one_set = counts.rows_share_one_l1_set(area, plan.filters_per_tile, busiest)
    cost = weights.in_place_cost_of(shape, pointwise=one_set)
    which = "the weights' in_place_filter_cost"
    if shape in dict(weights.in_place_cost_table(one_set)):
        on_one_set = one_set and weights.pointwise_in_place_costs
        which = "this shape's" + (" on 1x1 layers whose rows share an L1 set" if on_one_set else "")
        which += ", calibrated"
    return f"each read c_in_place {cost:.3g} ({which})"


def padding_share(plan) -> float:
    """Share of the micro-kernels' multiply-adds spent on padded rows and columns."""
    g = plan.geometry
    useful = (
        g.windows * g.filters_per_group * g.channels_per_group * (g.kernel_height * g.kernel_width)
    )
    padded = plan.cost_of(plan.schedule).padded_macs
    return 1 - useful / padded if padded else 0.0


def dense_story(plan) -> str:
    """A dense (outer-product) plan's story: the machine, the problem, the
    tiles and their cache occupancy, both schedules' modelled traffic, the
    choice and the loop nest."""
    g, hw = plan.geometry, plan.hardware
    weights = hw.weights
    s = np.dtype(plan.dtype).itemsize
    area = g.kernel_height * g.kernel_width
    x_shape = (g.batch, g.channels, g.height, g.width)
    w_shape = (g.filters, g.channels_per_group, g.kernel_height, g.kernel_width)
    nc, nf, nwin = plan.channel_tile, plan.filters_per_tile, plan.windows_per_tile
    in_b = tiles.input_tile_bytes(nc, area, nwin, s)
    fs_b = tiles.filter_tile_bytes(nc, area, nf, s)
    out_b = tiles.output_tile_bytes(nwin, nf, s)
    lines = [
        "Hardware (" + hw.source + ")",
        f"  L1 {size_text(hw.l1_bytes)}, L2 {size_text(hw.l2_bytes)} per core; "
        f"L3 {size_text(hw.l3_bytes)} shared; line {hw.line_bytes} B; "
        f"{hw.vector_bytes * 8}-bit vectors x "
        f"{hw.vector_registers} registers; {hw.cores} core(s); tiles may use "
        f"{hw.usable_fraction:.0%} of each cache ({hw.weights.sweep_fraction:.0%} of that for the "
        f"swept K2/K3 blocks); micro-kernel software prefetch "
        + (f"{hw.kernel_prefetch_distance} steps ahead" if hw.kernel_prefetch_distance else "off"),
        f"  cost per byte: L2 {weights.l2_cost:g}, L3 {weights.l3_cost:g}, "
        f"DRAM {weights.dram_cost:g}; per TLB miss {weights.tlb_miss_cost:g} "
        f"({hw.tlb_entries} entries, {hw.page_bytes} B pages); per micro-kernel call "
        f"{weights.call_cost:g}; per L1-spilled byte {weights.l1_miss_cost:g}; share of WS's "
        f"filter stream hidden behind the FMAs {weights.stream_overlap:g}",
        "  " + weights_origin(weights),
        "",
        "Problem",
        f"  x {x_shape}, w {w_shape} -> y {g.output_shape}, {plan.dtype}; "
        f"stride {(g.stride_h, g.stride_w)}, padding "
        f"{((g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right))}, dilation "
        f"{(g.dilation_h, g.dilation_w)}, groups {g.groups}; {g.flops / 1e9:.3f} GFLOP",
        "",
        "Tiles",
        f"  micro-kernel Nf x Nwin = {plan.filters_per_tile} x {plan.windows_per_tile} "
        f"({plan.filters_per_tile * plan.windows_per_tile // plan.vector_lanes} accumulator "
        f"vectors of {plan.vector_lanes} {plan.vector_operand}"
        + ("; needs the filters packed" if plan.vector_operand == VectorOperand.FILTERS else "")
        + f"); {padding_share(plan):.1%} of its multiply-adds are padding; "
        f"{_mac_cost_story(plan)}",
        f"  Nc = {nc} channels per tile; K2 = {plan.l2_tiles}; K3 = {plan.l3_tiles}; "
        f"planned for {plan.threads} thread(s)",
        "  windows: "
        + (
            f"the batch folded into one run of {g.batch} x {g.windows} = "
            f"{plan.window_count} windows, {ceil_div(plan.window_count, nwin)} tiles"
            if plan.batch_folded
            else f"{g.windows} per image, {ceil_div(g.windows, nwin)} tiles each"
        ),
        f"  IN  = Nc*R*S*Nwin*s = {size_text(in_b)}",
        f"  FS  = Nc*R*S*Nf*s   = {size_text(fs_b)}",
        f"  OUT = Nwin*Nf*s     = {size_text(out_b)}",
        f"  SRC = {size_text(_source_bytes(plan))}: the input rows packing one panel reads "
        "(beside the panels in the L2 rule; 0 when the input is read in place)",
        "",
        f"Cache occupancy ({plan.schedule})",
    ]
    for name, used, usable, capacity in _occupancy(plan):
        lines.append(
            f"  {name}: {size_text(used):>10} = {used / capacity:6.1%} of {size_text(capacity)} "
            f"(rule limit {size_text(usable)})"
        )
    lines += ["", "Predicted traffic per (group, image), each schedule with its own tiles"]
    if plan.batch_folded:
        lines[-1] += f" (the folded run's, divided by its {g.batch} images)"
    lines.append(
        f"  {'':4} {'Nc,K2,K3':>14} {'DRAM':>10} {'L3':>10} {'L2':>10} {'L1 spill':>10} "
        f"{'TLB miss':>9} {'calls':>7} {'packed in':>10} {'busiest':>8} {'cost':>10}"
    )
    tiles_of = dict(plan.tiles_by_schedule)
    for name, traffic in plan.costs:
        nc_k2_k3 = ",".join(str(v) for v in tiles_of[name])
        lines.append(
            f"  {name:4} {nc_k2_k3:>14} {size_text(traffic.dram):>10} "
            f"{size_text(traffic.l3):>10} {size_text(traffic.l2):>10} "
            f"{size_text(traffic.l1_spill):>10} {traffic.tlb_misses:>9} "
            f"{traffic.kernel_calls:>7} {traffic.packed_input_elements:>10} "
            f"{traffic.imbalance:>7.3f}x {traffic.cost:>10.4g}"
        )
    lines.append(
        "  (packed in: input elements written into panels; busiest: the busiest thread's "
        "work over an even share, which scales the cost)"
    )
    lines.append("  " + input_pack_story(plan))
    if _filter_pack_story(plan):
        lines.append("  " + _filter_pack_story(plan))
    lines += ["", "Choice", "  " + _why(plan)]
    chosen = plan.cost_of(plan.schedule)
    if chosen.in_place_filter_reads:
        lines.append(
            f"  filters read in place from KCRS: {plan.filters_per_tile} rows "
            f"{g.channels_per_group * area * s} B apart"
            + (
                f", more to one L1 set than its {hw.l1_ways} ways hold: broadcasts "
                f"reload their lines from L2, {chosen.conflicting_filter_reads} reads priced "
                "so (a share that grows as the rows overflow the set)"
                if chosen.conflicting_filter_reads
                else f", within the L1's {hw.l1_ways} ways"
            )
            + f"; {_in_place_cost_story(plan, g.channels_per_group * area * s)}"
        )
    input_way = input_way_story(plan)
    if input_way:
        lines.append("  " + input_way)
    if plan.batch_folded:
        lines.append("  " + _why_folded(plan))
    lines += ["", "Loop nest"]
    lines += ["  " + line for line in _loop_nest(plan).splitlines()]
    return "\n".join(lines)
