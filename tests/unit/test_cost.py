"""The cost model's terms, checked against hand-counted cases."""

from __future__ import annotations

import pytest

import cso
from cso.analysis import counts


@pytest.mark.parametrize(
    "rows, stride, expected",
    [
        (14, 4096, 14),  # 1x1 layer of 1024 float32 channels: every row in one set
        (14, 8192, 14),
        (14, 2048, 7),  # two sets
        (8, 4096, 8),
        (14, 64 * 9 * 4, 1),  # 3x3 of 64 channels: 9 lines apart, all sets distinct
        (0, 4096, 0),
    ],
)
def test_rows_per_l1_set(rows, stride, expected):
    # A 32 KiB, 8-way L1 of 64-byte lines has 64 sets: 4 KiB apart is the same set.
    assert counts.rows_per_l1_set(rows, stride, 64, 64) == expected


def test_conflicting_reads_only_beyond_the_ways():
    assert counts.conflicting_filter_reads(1000, 9, 8) == 1000
    assert counts.conflicting_filter_reads(1000, 8, 8) == 0
    # Scaled by how far the rows overflow the set, against the probe's rows.
    conflicting = counts.conflicting_filter_reads
    assert conflicting(1000, 16, 12, probe_rows=16) == 1000
    assert conflicting(1000, 14, 12, probe_rows=16) == round(1000 * (2 / 14) / (4 / 16))
    assert conflicting(1000, 14, 8, probe_rows=16) == round(1000 * (6 / 14) / (8 / 16))
    assert conflicting(1000, 12, 12, probe_rows=16) == 0


def test_the_conflict_probe_shape_is_the_widest_beyond_the_ways():
    from cso.analysis.tiles import conflict_probe_shape

    assert conflict_probe_shape(64, 32, 12) == (16, 16)
    assert conflict_probe_shape(64, 32, 16) is None
    assert conflict_probe_shape(32, 16, 8) is None


def test_the_conflict_is_priced_and_steers_the_plan():
    # 1x1, 1024 channels: a 14-row window-vectorised kernel reading filters
    # in place puts all 14 rows in one set of an 8-way L1; with 16 ways it fits.
    x_shape, w_shape = (1, 1024, 14, 14), (256, 1024, 1, 1)
    eight = cso.Hardware(l1_ways=8, vector_bytes=64, vector_registers=32)
    sixteen = eight.with_changes(l1_ways=16)
    forced = dict(filters_per_tile=14, windows_per_tile=32, vector_operand="windows", threads=1)
    conflicted = cso.plan_conv2d(x_shape, w_shape, hardware=eight, **forced)
    spared = cso.plan_conv2d(x_shape, w_shape, hardware=sixteen, **forced)
    traffic = conflicted.cost_of(conflicted.schedule)
    # 14 rows in one set of 8 ways, priced against the probe's 16 rows.
    expected = round(traffic.in_place_filter_reads * (6 / 14) / (8 / 16))
    assert traffic.conflicting_filter_reads == expected > 0
    assert spared.cost_of(spared.schedule).conflicting_filter_reads == 0
    assert traffic.cost > spared.cost_of(spared.schedule).cost
    # Left to choose, the analysis avoids 14 in-place filter rows on the 8-way L1.
    chosen = cso.plan_conv2d(x_shape, w_shape, hardware=eight, threads=1)
    assert not (chosen.vector_operand == "windows" and chosen.filters_per_tile > 8)
    # Filters packed ahead are read from a panel: no conflict.
    packed = cso.plan_conv2d(x_shape, w_shape, hardware=eight, filters_prepacked=True, **forced)
    assert packed.cost_of(packed.schedule).conflicting_filter_reads == 0
    assert "more to one L1 set than its 8 ways hold" in cso.explain(conflicted)
    assert "within the L1's 16 ways" in cso.explain(spared)


def test_a_shapes_1x1_mac_cost_prices_1x1_layers_only():
    # The 8x8 kernel's 1x1 figure (6.0) prices a 1x1 layer's multiply-adds
    # and explain names it; a 3x3 layer keeps the shape's own figure (4.4).
    from dataclasses import replace

    base = cso.Hardware(vector_bytes=32, vector_registers=16, cores=2)
    plain = replace(base.weights, mac_cost=4.0, kernel_mac_costs=(("8x8w", 4.4),))
    dear = replace(plain, pointwise_mac_costs=(("6x16w", 4.0), ("8x8w", 6.0)))
    forced = dict(filters_per_tile=8, windows_per_tile=8, vector_operand="windows", threads=1)

    def plan(weights, w_shape, padding):
        return cso.plan_conv2d(
            (1, 64, 14, 14), w_shape, padding=padding,
            hardware=base.with_changes(weights=weights), **forced,
        )  # fmt: skip

    def mac_share(p):
        traffic = p.cost_of(p.schedule)
        return traffic.padded_macs, traffic.cost

    pointwise = [plan(weights, (64, 64, 1, 1), 0) for weights in (plain, dear)]
    spatial = [plan(weights, (64, 64, 3, 3), 1) for weights in (plain, dear)]
    (macs, cheap_cost), (_, dear_cost) = (mac_share(p) for p in pointwise)
    # Same tiles, so the costs differ by exactly (6.0 - 4.4) per padded multiply-add.
    assert pointwise[0].tiles_by_schedule == pointwise[1].tiles_by_schedule
    assert dear_cost - cheap_cost == pytest.approx(1.6 * macs)
    assert mac_share(spatial[0]) == mac_share(spatial[1])
    assert "c_mac 6 (this shape's on 1x1 layers, calibrated)" in cso.explain(pointwise[1])
    assert "c_mac 4.4 (this shape's, calibrated)" in cso.explain(spatial[1])


def test_packing_up_front_costs_its_fixed_part_once_a_call_on_every_worker():
    # filter_pack_call_cost: a call that packs its panels up front pays it
    # once, on the calling thread while the other workers wait (threads x),
    # shared by the call's images; filters packed ahead, or tile by tile in
    # the loop nest, pay none.
    from dataclasses import replace

    base = cso.Hardware(vector_bytes=64, vector_registers=32, cores=2)
    fixed = replace(base.weights, filter_pack_call_cost=1e6)
    plain, dear = base, base.with_changes(weights=fixed)
    x_shape, w_shape = (1, 512, 28, 28), (128, 512, 1, 1)
    forced = dict(
        filters_per_tile=32, windows_per_tile=14, vector_operand="filters", schedule="WS"
    )

    def cost(hardware, threads, batch=1, **more):
        plan = cso.plan_conv2d(
            (batch,) + x_shape[1:], w_shape, hardware=hardware, threads=threads, **forced, **more
        )
        return plan.cost_of(plan.schedule).cost, plan

    for threads in (1, 2):
        (with_fixed, plan), (without, _) = cost(dear, threads), cost(plain, threads)
        assert not plan.packs_filters_in_nest
        assert with_fixed - without == pytest.approx(1e6 * threads)
        assert "fixed 1e+06 a call" in cso.explain(plan)
    # Eight images share one packing: an eighth of it each.
    (with_fixed, plan), (without, _) = cost(dear, 1, batch=8), cost(plain, 1, batch=8)
    assert with_fixed - without == pytest.approx(1e6 / 8, rel=1e-6)
    prepacked = dict(filters_prepacked=True)
    assert cost(dear, 1, **prepacked)[0] == cost(plain, 1, **prepacked)[0]
    # A 7x7 layer's four window tiles are one block: its tiles are packed in the nest.
    in_nest = [
        cso.plan_conv2d((1, 256, 7, 7), (256, 256, 1, 1), hardware=h, threads=1, **forced)
        for h in (dear, plain)
    ]
    assert in_nest[0].packs_filters_in_nest
    assert in_nest[0].cost_of("WS").cost == in_nest[1].cost_of("WS").cost


def test_filters_packed_for_workers_reading_every_panel_cost_the_shared_rate():
    # filter_pack_shared_cost prices a call's filter packing exactly when the
    # plan runs on more than one thread and its workers each read every
    # panel: IS, or WS with its window tiles split into parts.  One thread,
    # or WS workers that read the filter blocks they packed: filter_pack_cost.
    from dataclasses import replace

    from cso.analysis.pricing import filter_pack_cost_for

    base = cso.Hardware(vector_bytes=64, vector_registers=32, cores=2)
    weights = replace(base.weights, filter_pack_cost=100.0, filter_pack_shared_cost=100.0)
    dear_weights = replace(weights, filter_pack_shared_cost=250.0)
    assert filter_pack_cost_for(dear_weights, 1, "IS", 1) == 100.0
    assert filter_pack_cost_for(dear_weights, 1, "WS", 2) == 100.0
    assert filter_pack_cost_for(dear_weights, 2, "WS", 1) == 100.0
    assert filter_pack_cost_for(dear_weights, 2, "WS", 2) == 250.0
    assert filter_pack_cost_for(dear_weights, 2, "IS", 1) == 250.0
    cheap, dear = base.with_changes(weights=weights), base.with_changes(weights=dear_weights)
    x_shape, w_shape = (1, 128, 28, 28), (512, 128, 1, 1)
    forced = dict(filters_per_tile=32, windows_per_tile=14, vector_operand="filters")

    def cost(hardware, threads, schedule):
        plan = cso.plan_conv2d(
            x_shape, w_shape, hardware=hardware, threads=threads, schedule=schedule, **forced
        )
        return plan.cost_of(plan.schedule).cost

    # One thread: the shared figure is never used, the plans cost the same.
    for schedule in ("IS", "WS"):
        assert cost(dear, 1, schedule) == cost(cheap, 1, schedule)
    # Two threads, IS: every candidate packs for workers reading every panel.
    assert cost(dear, 2, "IS") > cost(cheap, 2, "IS")
    # explain says which price the call's filter packing got.
    shared = cso.plan_conv2d(x_shape, w_shape, hardware=dear, threads=2, schedule="IS", **forced)
    alone = cso.plan_conv2d(x_shape, w_shape, hardware=dear, threads=1, schedule="IS", **forced)
    assert "c_pack 250, shared: every worker reads every panel" in cso.explain(shared)
    assert "filter packing in the call: 65536 elements at c_pack 100\n" in cso.explain(alone) + "\n"


def test_packed_filter_memory_bytes_beyond_what_stays_in_the_l3():
    mib = 1 << 20
    # A worker's share of the panels beyond the resident footprint: 2x to and from memory.
    assert counts.packed_filter_memory_bytes(3 * mib, 4, 8 * mib) == 24 * mib
    assert counts.packed_filter_memory_bytes(2 * mib, 4, 8 * mib) == 0
    # Two workers splitting the filter blocks keep half each.
    assert counts.packed_filter_memory_bytes(3 * mib, 4, 8 * mib, sharers=2) == 0
    assert counts.packed_filter_memory_bytes(5 * mib, 4, 8 * mib, sharers=2) == 40 * mib
    assert counts.packed_filter_memory_bytes(0, 4, 8 * mib) == 0


def test_big_filter_panels_packed_in_the_call_cost_their_memory_traffic():
    # 3x3 512->512: 9.4 MB of float32 filters.  With a 2 MiB L2 (8 MiB
    # resident in the L3) a 32x14 plan packing them up front per call (IS)
    # moves its panels to and from memory; with a 4 MiB L2 (16 MiB) it does
    # not, nor with the filters packed ahead, nor packing them tile by tile
    # in the loop nest (WS, every window tile in one block).
    x_shape, w_shape = (1, 512, 14, 14), (512, 512, 3, 3)
    small_l2 = cso.Hardware(
        l2_bytes=2 << 20, l3_bytes=480 << 20, cores=2, vector_bytes=64, vector_registers=32
    )
    large_l2 = small_l2.with_changes(l2_bytes=4 << 20)
    forced = dict(
        filters_per_tile=32, windows_per_tile=14, vector_operand="filters", padding=1,
        schedule="IS",
    )  # fmt: skip

    def traffic(hardware, **extra):
        plan = cso.plan_conv2d(x_shape, w_shape, hardware=hardware, **forced, **extra)
        return plan, plan.cost_of(plan.schedule)

    plan, charged = traffic(small_l2, threads=1)
    assert charged.panel_memory == 2 * charged.packed_filter_elements * 4 == 18 << 20
    assert "between them and DRAM" in cso.explain(plan)
    assert traffic(large_l2, threads=1)[1].panel_memory == 0
    assert traffic(small_l2, threads=1, filters_prepacked=True)[1].panel_memory == 0
    # The count is part of the DRAM bytes the cost weighs.
    free = cso.plan_conv2d(x_shape, w_shape, hardware=large_l2, threads=1, **forced)
    assert charged.dram - charged.panel_memory == free.cost_of(free.schedule).dram
    in_nest = cso.plan_conv2d(
        x_shape, w_shape, hardware=small_l2, threads=1, **dict(forced, schedule="WS")
    )
    assert in_nest.packs_filters_in_nest and not plan.packs_filters_in_nest
    assert in_nest.cost_of(in_nest.schedule).panel_memory == 0
    assert "each tile packed in the loop nest just before its use" in cso.explain(in_nest)
    assert "pack FS(c0, f)" in cso.explain(in_nest) and "pack FS(c0, f)" not in cso.explain(plan)
