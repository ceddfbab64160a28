"""The CSA rules and the plan, on injected hardware (no JIT)."""

import dataclasses

import numpy as np
import pytest

from conftest import AVX512_CORE

from cso import Hardware, Plan, plan_conv2d
from cso.analysis import tiles
from cso.analysis.candidates import packing_source_tile_bytes, problem_of
from cso.analysis.choices import VectorOperand
from cso.analysis.cost import schedule_traffic
from cso.geometry import ceil_div

SMALL = Hardware(
    l1_bytes=32 * 1024,
    l2_bytes=256 * 1024,
    l3_bytes=2 * 1024 * 1024,
    vector_bytes=32,
    vector_registers=16,
    cores=1,
)
AVX512 = AVX512_CORE

LAYERS = [
    ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ((1, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    ((1, 2048, 7, 7), (512, 2048, 1, 1), 1, 0),
    ((2, 512, 28, 28), (512, 512, 3, 3), 1, 1),
]


def _sizes(plan, channel_tile):
    g, s = plan.geometry, np.dtype(plan.dtype).itemsize
    area = g.kernel_height * g.kernel_width
    return (
        tiles.input_tile_bytes(channel_tile, area, plan.windows_per_tile, s),
        tiles.filter_tile_bytes(channel_tile, area, plan.filters_per_tile, s),
        tiles.output_tile_bytes(plan.windows_per_tile, plan.filters_per_tile, s),
    )


def _usable(hardware, level):
    fraction = hardware.usable_fraction
    if level != "l1":  # the K2 and K3 blocks are swept: a share of the usable bytes
        fraction *= hardware.weights.sweep_fraction
    return int(getattr(hardware, f"{level}_bytes") * fraction)


@pytest.mark.parametrize("hardware", [SMALL, AVX512])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", LAYERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_rule_holds_and_is_tight(hardware, x_shape, w_shape, stride, padding, dtype):
    # The dense plan's rules (its 3x3 stride-1 layers may be planned Winograd).
    plan = plan_conv2d(
        x_shape, w_shape, stride=stride, padding=padding, dtype=dtype, hardware=hardware,
        threads=1, algorithm="dense",
    )
    g = plan.geometry
    l1, l2, l3 = (_usable(hardware, level) for level in ("l1", "l2", "l3"))
    area = g.kernel_height * g.kernel_width
    s = np.dtype(dtype).itemsize
    # L1: IN + FS + OUT <= L1 for the rule's Nc, and Nc + 1 breaks it unless Nc == C.
    rule = tiles.channel_tile(
        l1, g.channels_per_group, area, plan.filters_per_tile, plan.windows_per_tile, s
    )
    assert sum(_sizes(plan, rule)) <= l1 or rule == 1
    if rule < g.channels_per_group:
        assert sum(_sizes(plan, rule + 1)) > l1
    # A plan with the batch folded tiles the N images' windows as one run.
    window_tiles = ceil_div(plan.window_count, plan.windows_per_tile)
    filter_tiles = ceil_div(g.filters_per_group, plan.filters_per_tile)
    for name, (nc, k2, k3) in plan.tiles_by_schedule:
        # The schedule's channel tile is one of the candidates the rule starts.
        assert nc in tiles.channel_tile_candidates(rule, g.channels_per_group)
        in_b, fs_b, out_b = _sizes(plan, nc)
        resident, streamed = (in_b, fs_b) if name == "IS" else (fs_b, in_b)
        resident_count, streamed_count = (
            (window_tiles, filter_tiles) if name == "IS" else (filter_tiles, window_tiles)
        )
        # In L2 the input panel's term also holds the rows it is packed from.
        source = packing_source_tile_bytes(problem_of(plan), nc, plan.windows_per_tile)
        resident_l2, streamed_l2 = (
            (in_b + source, fs_b) if name == "IS" else (fs_b, in_b + source)
        )

        def l2_rule(k):
            return resident_l2 + k * streamed_l2 + k * out_b <= l2

        def l3_rule(k):
            return k * resident + k2 * streamed + k2 * k * out_b <= l3

        assert l2_rule(k2) or k2 == 1
        assert k2 == streamed_count or not l2_rule(k2 + 1)
        assert l3_rule(k3) or k3 == 1
        assert k3 == resident_count or not l3_rule(k3 + 1)


def test_channel_tile_is_the_cheapest_candidate():
    from cso.analysis.candidates import TileChoice, cache_tiles, schedule_cost
    from cso.analysis.planner import TIE_TOLERANCE

    plan = plan_conv2d((1, 512, 7, 7), (512, 512, 3, 3), padding=1, hardware=AVX512, threads=1)
    rule = tiles.channel_tile(
        _usable(AVX512, "l1"), 512, 9, plan.filters_per_tile, plan.windows_per_tile, 4
    )
    for name, (nc, k2, k3) in plan.tiles_by_schedule:
        chosen = dict(plan.costs)[name].cost
        for candidate in tiles.channel_tile_candidates(rule, 512):
            ck2, ck3 = cache_tiles(plan, name, candidate)
            other = schedule_cost(plan, TileChoice(name, candidate, ck2, ck3))
            # Cheapest, or tied with the cheapest (the deeper tile is taken).
            assert chosen <= other.cost * (1 + TIE_TOLERANCE)
    # Few windows: deeper tiles than the L1 rule's pay for themselves (fewer calls).
    assert plan.channel_tile > rule


@pytest.mark.parametrize(
    "height, width, kernel, stride, dilation, padding",
    [(56, 56, 1, 1, 1, 0), (56, 56, 1, 2, 1, 0), (112, 112, 3, 1, 1, 1), (56, 56, 3, 2, 1, 1),
     (224, 224, 7, 2, 1, 3), (28, 28, 3, 1, 2, 2), (7, 7, 3, 1, 1, 1)],
)  # fmt: skip
@pytest.mark.parametrize("windows_per_tile", [14, 48])
def test_packing_source_bytes_counts_the_rows_a_panel_reads(
    height, width, kernel, stride, dilation, padding, windows_per_tile
):
    out_height = (height + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    out_width = (width + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    # Brute force: the input rows each tile of consecutive windows reads, on average.
    windows = out_height * out_width
    counts = []
    for start in range(0, windows - windows_per_tile + 1, windows_per_tile):
        rows = {
            (w // out_width) * stride - padding + r * dilation
            for w in range(start, start + windows_per_tile)
            for r in range(kernel)
        }
        counts.append(len(rows))
    source = tiles.packing_source_bytes(
        3, windows_per_tile, out_width, height, width, dilation * (kernel - 1) + 1, stride, 4
    )
    rows = source / (3 * width * 4)
    # Padding rows are not read and a tile may straddle one more row: within two rows.
    assert abs(rows - np.mean(counts)) <= 2.0
    assert rows <= height
    if kernel == 1 and padding == 0:
        # A 1x1 panel reads exactly its own elements, and at stride 2 the
        # skipped columns' half of every line.
        panel = tiles.input_tile_bytes(3, 1, windows_per_tile, 4)
        assert source == pytest.approx(panel * stride, rel=1e-6, abs=4 * 3)


def test_l2_rule_keeps_a_pointwise_panel_beside_its_source():
    # 1x1 stride 1: SRC == IN, so WS keeps half as many panels as IN alone would allow.
    plan = plan_conv2d((1, 256, 56, 56), (128, 256, 1, 1), hardware=AVX512, threads=1,
                       schedule="WS")  # fmt: skip
    in_b, fs_b, out_b = _sizes(plan, plan.channel_tile)
    source = packing_source_tile_bytes(problem_of(plan), plan.channel_tile, plan.windows_per_tile)
    assert source == in_b
    window_tiles = ceil_div(plan.window_count, plan.windows_per_tile)
    expected = tiles.l2_tiles(_usable(AVX512, "l2"), fs_b, 2 * in_b, out_b, window_tiles)
    assert plan.l2_tiles == expected
    assert expected < tiles.l2_tiles(_usable(AVX512, "l2"), fs_b, in_b, out_b, window_tiles)


def test_packed_input_rows_are_counted_in_whole_vectors():
    from cso.analysis.counts import packed_input_elements

    # 3 window tiles of 7 windows, 10 channels: rows of 7 are written as 16-lane vectors.
    input_all = 10 * 7 * 4
    assert packed_input_elements("IS", False, 1, 3, input_all, 4, 7, 16) == 3 * 10 * 16
    # Rows of whole vectors count as they are; WS packs once per filter block.
    assert packed_input_elements("WS", False, 2, 3, 10 * 32 * 4, 4, 32, 16) == 2 * 3 * 10 * 32
    assert packed_input_elements("WS", True, 2, 3, input_all, 4, 7, 16) == 0


def test_channel_tile_candidates():
    assert tiles.channel_tile_candidates(25, 64) == [22, 32, 64]
    assert tiles.channel_tile_candidates(64, 64) == [64]
    assert tiles.channel_tile_candidates(1, 5) == [1, 2, 3, 5]


def test_l3_tiles_capped_so_every_thread_has_work():
    plan = plan_conv2d(
        (1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=AVX512, threads=2, schedule="IS"
    )
    window_tiles = ceil_div(56 * 56, plan.windows_per_tile)
    assert plan.l3_tiles <= ceil_div(window_tiles, 2)


def test_register_block_matches_the_register_file():
    assert tiles.register_blocks(64, 32, 4) == [(14, 32), (8, 32), (8, 48), (16, 16)]
    assert tiles.register_blocks(32, 16, 4) == [(6, 16), (4, 16), (4, 24), (8, 8)]
    for vector_bytes, registers in ((64, 32), (32, 16), (16, 32), (16, 16)):
        for element_bytes in (4, 8):
            lanes = vector_bytes // element_bytes
            for nf, nwin in tiles.register_blocks(vector_bytes, registers, element_bytes):
                # Accumulators, the input vectors and one broadcast fit the registers.
                assert nf * (nwin // lanes) + nwin // lanes + 1 <= registers
    assert tiles.register_block(64, 32, 4) == (14, 32)
    assert tiles.register_block(64, 32, 8) == (14, 16)
    assert tiles.register_block(32, 16, 4) == (6, 16)


def test_plan_is_frozen_and_carries_both_costs():
    plan = plan_conv2d((1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=AVX512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.schedule = "WS"
    costs = dict(plan.costs)
    assert set(costs) == {"IS", "WS"}
    assert plan.schedule == min(costs, key=lambda name: costs[name].cost)


def test_schedule_can_be_forced_and_is_validated():
    for schedule in ("IS", "WS"):
        assert plan_conv2d((1, 8, 8, 8), (8, 8, 3, 3), schedule=schedule).schedule == schedule
    with pytest.raises(ValueError, match="schedule"):
        plan_conv2d((1, 8, 8, 8), (8, 8, 3, 3), schedule="OS")


def test_tile_overrides():
    plan = plan_conv2d(
        (1, 8, 8, 8), (8, 8, 3, 3), hardware=AVX512, filters_per_tile=4, windows_per_tile=16
    )
    assert (plan.filters_per_tile, plan.windows_per_tile) == (4, 16)
    with pytest.raises(ValueError, match="multiple of the vector lanes"):
        plan_conv2d((1, 8, 8, 8), (8, 8, 3, 3), hardware=AVX512, windows_per_tile=20)
    with pytest.raises(ValueError, match="filters_per_tile"):
        plan_conv2d((1, 8, 8, 8), (8, 8, 3, 3), filters_per_tile=0)
    with pytest.raises(TypeError, match="hardware"):
        plan_conv2d((1, 8, 8, 8), (8, 8, 3, 3), hardware="avx512")
    with pytest.raises(TypeError, match="dtype"):
        plan_conv2d((1, 8, 8, 8), (8, 8, 3, 3), dtype=np.int32)


def test_ws_filter_stream_by_hand():
    """WS's filter stream from L3 (``streamed_l3``): ``B_w`` passes over the
    filters, less the first where the kernel reads them in place (that one
    is the compulsory read); none where each tile is packed in the nest
    just before use (it stays in L1/L2); and one copy for the workers of a
    call's window parts, which read the same filters together."""
    common = dict(
        channels=4, kernel_area=9, height=10, width=10, filters=8, windows=64, channel_tile=4,
        element_bytes=4, hardware=AVX512,
    )  # fmt: skip
    filter_tiles = 2
    windows_tiles = dict(filters_per_tile=4, windows_per_tile=16)
    filter_all = 4 * 9 * 4 * 4
    in_place = schedule_traffic("WS", k2=1, k3=2, **windows_tiles, **common)
    assert in_place.streamed_l3 == (4 - 1) * filter_tiles * filter_all  # B_w = 4
    prepacked = schedule_traffic(
        "WS", k2=1, k3=2, **windows_tiles, filters_prepacked=True, **common
    )
    assert prepacked.streamed_l3 == (4 - 1) * filter_tiles * filter_all
    parts = schedule_traffic(
        "WS", k2=1, k3=2, **windows_tiles, window_parts=2, threads=2, **common
    )
    assert parts.streamed_l3 == (2 - 1) * filter_tiles * filter_all  # 4 blocks read in pairs
    filter_tiles_f = 1  # 8 filters in one 16-filter tile
    filters_tiles = dict(
        filters_per_tile=16, windows_per_tile=4, vector_operand=VectorOperand.FILTERS
    )
    filter_all_f = 4 * 9 * 16 * 4
    up_front = schedule_traffic("WS", k2=4, k3=1, **filters_tiles, **common)
    assert up_front.packed_filter_elements > 0
    assert up_front.streamed_l3 == 4 * filter_tiles_f * filter_all_f  # 16 window tiles, K2 = 4
    in_nest = schedule_traffic("WS", k2=16, k3=1, **filters_tiles, **common)
    assert in_nest.streamed_l3 == 0


def test_cost_model_counts_by_hand():
    """A case small enough to count: IS streams filters once per window block,
    WS re-reads (and re-packs) the input once per filter block."""
    common = dict(
        channels=4,
        kernel_area=9,
        height=10,
        width=10,
        filters=8,
        windows=64,
        channel_tile=4,
        filters_per_tile=4,
        windows_per_tile=16,
        element_bytes=4,
        hardware=AVX512,
    )
    is_traffic = schedule_traffic("IS", k2=1, k3=2, **common)
    ws_traffic = schedule_traffic("WS", k2=2, k3=1, **common)
    raw, filter_all, input_all = 4 * 100 * 4, 4 * 9 * 4 * 4, 4 * 9 * 16 * 4
    window_tiles, filter_tiles = 4, 2
    # Everything fits in L3 here, so only the compulsory traffic reaches DRAM.
    compulsory = raw + filter_tiles * filter_all + 8 * 64 * 4
    assert is_traffic.dram == compulsory == ws_traffic.dram
    out_tile = 16 * 4 * 4
    partials = window_tiles * filter_tiles * out_tile  # one channel tile: written once
    # IS: B_w = 2 blocks stream all filters; B_f = 2 blocks re-read each input tile; packed once.
    assert is_traffic.l3 == (
        2 * filter_tiles * filter_all + 2 * window_tiles * input_all + window_tiles * input_all
    )
    assert is_traffic.l2 == window_tiles * filter_tiles * filter_all + partials
    # WS: B_f = 2 filter blocks re-read the raw input (once beyond compulsory),
    # B_w = 2 window blocks stream the filters, which the kernel reads in
    # place: the first pass is the compulsory read, the second from L3.
    assert ws_traffic.l3 == raw + 1 * filter_tiles * filter_all
    assert ws_traffic.l2 == (
        2 * window_tiles * input_all + window_tiles * filter_tiles * input_all + partials
    )
    # The whole output (2 KiB) is one page, entered once: one TLB miss each.
    assert is_traffic.tlb_misses == ws_traffic.tlb_misses == 1
    # One channel tile, 4 window tiles, 2 filter tiles: 8 calls; tiles fit L1.
    assert is_traffic.kernel_calls == ws_traffic.kernel_calls == 8
    assert is_traffic.l1_spill == ws_traffic.l1_spill == 0
    assert is_traffic.cost == (
        is_traffic.dram * AVX512.weights.dram_cost
        + is_traffic.l3 * AVX512.weights.l3_cost
        + is_traffic.l2 * AVX512.weights.l2_cost
        + AVX512.weights.tlb_miss_cost
        + 8 * AVX512.weights.call_cost
        + is_traffic.padded_macs * AVX512.weights.mac_cost
        + window_tiles * input_all // 4 * AVX512.weights.input_pack_cost
        # Per call, the window-vectorised kernel broadcasts one filter
        # element in place per 16 windows: MACs / 16 reads.
        + is_traffic.padded_macs // 16 * AVX512.weights.in_place_filter_cost
    )
    assert is_traffic.in_place_filter_reads == is_traffic.padded_macs // 16
    # Only WS's filter stream is credited as hidden behind the FMAs: its B_w = 2
    # passes over the filters less the first (the compulsory read), from L3,
    # half of their cost (it is far below the MACs').
    assert (is_traffic.streamed_l3, is_traffic.streamed_dram) == (0, 0)
    assert (ws_traffic.streamed_l3, ws_traffic.streamed_dram) == (filter_tiles * filter_all, 0)
    assert ws_traffic.cost == (
        ws_traffic.dram * AVX512.weights.dram_cost
        + ws_traffic.l3 * AVX512.weights.l3_cost
        + ws_traffic.l2 * AVX512.weights.l2_cost
        + AVX512.weights.tlb_miss_cost
        + 8 * AVX512.weights.call_cost
        + ws_traffic.padded_macs * AVX512.weights.mac_cost
        + 2 * window_tiles * input_all // 4 * AVX512.weights.input_pack_cost
        + ws_traffic.padded_macs // 16 * AVX512.weights.in_place_filter_cost
        - AVX512.weights.stream_overlap * ws_traffic.streamed_l3 * AVX512.weights.l3_cost
    )
    prepacked = schedule_traffic("IS", k2=1, k3=2, filters_prepacked=True, **common)
    assert prepacked.in_place_filter_reads == 0
    # Packed input elements: IS packs once, WS once per filter block (2 here).
    assert is_traffic.packed_input_elements == window_tiles * input_all // 4
    assert ws_traffic.packed_input_elements == 2 * window_tiles * input_all // 4
    assert is_traffic.imbalance == ws_traffic.imbalance == 1.0  # one thread
    # 4 window tiles of 16 x 2 filter tiles of 4, over C*R*S = 36.
    assert is_traffic.padded_macs == ws_traffic.padded_macs == 64 * 8 * 36


def test_hidden_stream_cost_by_hand():
    from cso.analysis.pricing import hidden_stream_cost

    hardware = AVX512.with_changes(stream_overlap=0.5)
    # 1000 L3 bytes (6000 units) behind 10**4 float32 MACs (40000 units): half hidden.
    assert (
        hidden_stream_cost(hardware, 4, streamed_dram=0, streamed_l3=1000, padded_macs=10**4)
        == 0.5 * 1000 * hardware.weights.l3_cost
    )
    # A stream longer than the MACs hides only as much as they take.
    assert (
        hidden_stream_cost(hardware, 4, streamed_dram=10**5, streamed_l3=0, padded_macs=10**4)
        == 0.5 * 10**4 * hardware.weights.mac_cost
    )
    # float64 MACs take two float32 lanes: twice the time to hide behind.
    assert (
        hidden_stream_cost(hardware, 8, streamed_dram=10**5, streamed_l3=0, padded_macs=10**4)
        == 0.5 * 10**4 * hardware.weights.mac_cost * 2
    )
    no_overlap = AVX512.with_changes(stream_overlap=0.0)
    assert hidden_stream_cost(no_overlap, 4, streamed_dram=1, streamed_l3=1, padded_macs=1) == 0


def test_stream_overlap_is_validated():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="stream_overlap must be in"):
            AVX512.with_changes(stream_overlap=bad)


def test_two_threads_split_the_windows_of_a_7x7_layer_with_large_filters():
    # l4 3x3 512 @7: splitting the filters makes each thread pack the whole
    # input; splitting the windows makes each stream all 9 MiB of filters,
    # which hides behind the FMAs (measured 1.07-1.10x faster, cost_weight.py).
    # The rule, not this machine's outcome: whatever the weights, the plan is
    # the cheaper schedule, and hiding WS's filter stream only lowers WS's cost.
    shape = ((1, 512, 7, 7), (512, 512, 3, 3))
    ws_costs = []
    for overlap in (0.0, 0.5, 1.0):
        hardware = AVX512.with_changes(stream_overlap=overlap)
        plan = plan_conv2d(*shape, padding=1, hardware=hardware, threads=2)
        for schedule in ("IS", "WS"):
            forced = plan_conv2d(*shape, padding=1, hardware=hardware, threads=2, schedule=schedule)
            assert plan.cost_of(plan.schedule).cost <= forced.cost_of(schedule).cost
        ws = plan_conv2d(*shape, padding=1, hardware=hardware, threads=2, schedule="WS")
        # Two window parts give each thread half the windows and all the filters.
        assert ws.window_parts in (1, 2)
        ws_costs.append(ws.cost_of("WS").cost)
    assert ws_costs[0] >= ws_costs[1] >= ws_costs[2]


def test_l1_spill_by_hand():
    from cso.analysis.cost import l1_spill_bytes

    assert l1_spill_bytes(20_000, 20_000, 2_000, 44_000, 10, 5) == 0
    # Reused by 5 consecutive calls: 4 of every 5 reads are the spill's.
    assert l1_spill_bytes(23_000, 20_000, 2_000, 44_000, 10, 5) == 184_000
    assert l1_spill_bytes(23_000, 20_000, 2_000, 44_000, 10, 1) == 0


def test_output_tlb_misses_by_hand():
    from cso.analysis.cost import output_pages_per_tile, output_tlb_misses

    # 56x56 float32 rows are 12.5 KiB: each of a tile's 14 rows is its own page.
    assert output_pages_per_tile(14, 56 * 56 * 4, 4096) == 14
    assert output_pages_per_tile(14, 14 * 14 * 4, 4096) == 3  # 14 rows of 784 B
    # IS cycling 19 filter tiles x 14 pages > 64 entries: every call misses 14 times.
    assert output_tlb_misses("IS", 1, 98, 19, 19, 14, 784, 64) == 98 * 19 * 14
    # WS stays on one tile's 14 pages: each output page is entered once.
    assert output_tlb_misses("WS", 1, 98, 19, 98, 14, 784, 64) == 784
    # IS with few filter tiles fits the TLB.
    assert output_tlb_misses("IS", 2, 98, 4, 4, 14, 200, 64) == 2 * 200


def test_window_parts_balance_the_threads():
    # One job per filter block is too few for 4 threads: split the windows.
    assert tiles.window_parts(4, 1, 1, 98) == 4
    assert tiles.window_parts(2, 1, 2, 98) == 1
    assert tiles.window_parts(8, 1, 1, 3) == 3  # never more parts than tiles
    plan = plan_conv2d(
        (1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=AVX512, threads=2, schedule="WS"
    )
    blocks = ceil_div(ceil_div(64, plan.filters_per_tile), plan.l3_tiles)
    assert blocks * plan.window_parts >= 2
    assert (
        plan_conv2d(
            (1, 64, 56, 56), (64, 64, 3, 3), padding=1, hardware=AVX512, schedule="IS"
        ).window_parts
        == 1
    )


def test_thread_imbalance_by_hand():
    from cso.analysis.cost import largest_job_share, thread_imbalance

    # One thread is never imbalanced, whatever the jobs.
    assert thread_imbalance(1, 1, 3, 1, largest_job_share("WS", 7, 32, 12, 1)) == 1.0
    # Seven window tiles in two parts (4 + 3) on two threads: 2 * 4/7.
    share = largest_job_share("WS", 7, 32, 32, 2)
    assert share == pytest.approx(4 / 7)
    assert thread_imbalance(2, 1, 1, 2, share) == pytest.approx(8 / 7)
    # The same layer's 32 filter tiles in two blocks of 16: even.
    assert thread_imbalance(2, 1, 2, 1, largest_job_share("WS", 7, 32, 16, 1)) == 1.0
    # Three equal jobs on two threads: the busier thread does two of them.
    assert thread_imbalance(2, 3, 1, 1, 1.0) == pytest.approx(4 / 3)
    # IS: window blocks of K3 tiles (25 tiles in blocks of 13 + 12).
    assert thread_imbalance(2, 1, 2, 1, largest_job_share("IS", 25, 8, 13, 1)) == pytest.approx(
        26 / 25
    )


def test_two_threads_split_the_filters_of_a_14x14_layer():
    """196 windows are 7 tiles of 32: two window parts leave one thread idle
    for a seventh of the layer, re-packing the input for a second filter
    block costs less (measured 1.05x; experiments/scaling.py)."""
    plan = plan_conv2d((1, 256, 14, 14), (256, 256, 3, 3), padding=1, hardware=AVX512, threads=2)
    assert plan.cost_of(plan.schedule).imbalance < 8 / 7
    one = plan_conv2d((1, 256, 14, 14), (256, 256, 3, 3), padding=1, hardware=AVX512, threads=1)
    assert one.cost_of(one.schedule).imbalance == 1.0


def test_input_read_in_place_only_for_small_planes():
    assert tiles.reads_input_in_place(1, 1, False, False, 14 * 14 * 4, 4096)
    assert not tiles.reads_input_in_place(1, 1, False, False, 56 * 56 * 4, 4096)
    assert not tiles.reads_input_in_place(3, 3, False, False, 14 * 14 * 4, 4096)
    assert not tiles.reads_input_in_place(1, 1, False, True, 14 * 14 * 4, 4096)
    assert not tiles.reads_input_in_place(1, 1, True, False, 14 * 14 * 4, 4096)
    assert plan_conv2d((1, 256, 14, 14), (64, 256, 1, 1), hardware=AVX512).input_in_place
    assert not plan_conv2d((1, 64, 56, 56), (64, 64, 1, 1), hardware=AVX512).input_in_place
    # Stride 2: the windows are every other pixel, gathered into panels.
    assert not plan_conv2d(
        (1, 64, 28, 28), (64, 64, 1, 1), stride=2, hardware=AVX512
    ).input_in_place


def test_reads_in_place_are_weighed_against_packing():
    """Where a 1x1 layer's input may be read in place, the planner prices
    both ways: at the default (0) it reads in place, and once a read costs
    more than packing the panels it packs them, channel by channel."""
    from cso.analysis import counts
    from cso.analysis.explain import explain

    layer = ((1, 1024, 14, 14), (256, 1024, 1, 1))
    free = plan_conv2d(*layer, hardware=AVX512)
    assert free.input_in_place and not free.pack_channels_outer
    chosen = free.cost_of(free.schedule)
    tiles_f = ceil_div(256, free.filters_per_tile)
    full_tiles = 196 // free.windows_per_tile
    assert chosen.in_place_input_reads == tiles_f * full_tiles * free.windows_per_tile * 1024
    assert chosen.packed_input_elements == 0
    dear = dataclasses.replace(
        AVX512, weights=dataclasses.replace(AVX512.weights, in_place_input_cost=50.0)
    )
    packed = plan_conv2d(*layer, hardware=dear)
    assert not packed.input_in_place and packed.pack_channels_outer
    assert packed.cost_of(packed.schedule).in_place_input_reads == 0
    assert packed.cost_of(packed.schedule).packed_input_elements > 0
    assert "input packed into panels" in explain(packed)
    assert "input read in place from x" in explain(free)
    # Large planes are packed whatever the weight; a dot product's one
    # window is the input itself, never priced as reads in place.
    assert not plan_conv2d((1, 64, 56, 56), (64, 64, 1, 1), hardware=AVX512).input_in_place
    fc = plan_conv2d((1, 512, 7, 7), (1000, 512, 7, 7), hardware=dear)
    assert fc.input_in_place and fc.cost_of(fc.schedule).in_place_input_reads == 0
    assert counts.in_place_input_reads(False, "windows", 4, 12, 16, 256) == 0
    assert counts.in_place_input_reads(True, "reduction", 4, 1, 1, 256) == 0
    assert counts.in_place_input_reads(True, "filters", 4, 32, 6, 256) == 4 * 32 * 6 * 256


def test_filter_vectorised_kernels_when_their_packing_pays():
    """32 filters per vector fit a 7x7 layer's 49 windows far better than
    32 windows per vector, but need every filter packed: the analysis takes
    them when the filters are packed ahead, or when the call's batch shares
    the packing, not for one image per call."""
    assert tiles.filter_vector_blocks(64, 32, 4) == [(32, 14), (48, 7)]
    assert tiles.filter_vector_blocks(32, 16, 4) == [(16, 6)]  # 48 x 7 needs 25 registers
    shape = ((1, 512, 7, 7), (512, 512, 3, 3))
    # The rule: the orientation chosen is the cheaper one under the model,
    # with the packing charged per call unless the filters are packed ahead.
    for prepacked_filters in (False, True):
        chosen = plan_conv2d(
            *shape, padding=1, hardware=AVX512, filters_prepacked=prepacked_filters
        )
        for operand in ("windows", "filters"):
            forced = plan_conv2d(
                *shape,
                padding=1,
                hardware=AVX512,
                filters_prepacked=prepacked_filters,
                vector_operand=operand,
            )
            assert chosen.cost_of(chosen.schedule).cost <= forced.cost_of(forced.schedule).cost
    per_call = plan_conv2d(*shape, padding=1, hardware=AVX512, vector_operand="windows")
    # The 48 x 7 kernel pads no window of 49 (its 512 filters are 11 tiles of 48).
    narrow = plan_conv2d(
        *shape, padding=1, hardware=AVX512, filters_prepacked=True, filters_per_tile=48,
        windows_per_tile=7, vector_operand="filters",
    )  # fmt: skip
    assert narrow.cost_of(narrow.schedule).padded_macs == 49 * 528 * 512 * 9
    prepacked = plan_conv2d(
        *shape,
        padding=1,
        hardware=AVX512,
        filters_prepacked=True,
        vector_operand="filters",
        filters_per_tile=32,
        windows_per_tile=14,
    )
    in_call = plan_conv2d(
        *shape, padding=1, hardware=AVX512, vector_operand="filters", schedule=prepacked.schedule
    )
    # Per call, the same plan also packs every filter: 512 * 4608 elements, priced.
    assert in_call.cost_of(in_call.schedule).packed_filter_elements == 512 * 512 * 9
    assert in_call.cost_of(in_call.schedule).cost > prepacked.cost_of(prepacked.schedule).cost
    traffic = prepacked.cost_of(prepacked.schedule)
    # Its transposed stores are priced: one per output element per call.
    assert traffic.transposed_stores == traffic.kernel_calls * 32 * 14 > 0
    assert per_call.cost_of(per_call.schedule).transposed_stores == 0
    # Padded multiply-adds: 49 windows in 4 tiles of 14, against 2 of 32.
    reduction = 512 * 9
    assert traffic.padded_macs == 56 * 512 * reduction
    nf = per_call.filters_per_tile
    padded_filters = ceil_div(512, nf) * nf
    assert per_call.cost_of(per_call.schedule).padded_macs == 64 * padded_filters * reduction
    assert prepacked.filters_prepacked and traffic.packed_filter_elements == 0
    batch = plan_conv2d(
        (32, 512, 7, 7), shape[1], padding=1, hardware=AVX512, vector_operand="filters"
    )
    assert not batch.filters_prepacked
    # Every filter (the last tile's padding too) packed once per call, charged per image.
    packed_filters = ceil_div(512, batch.filters_per_tile) * batch.filters_per_tile
    assert batch.cost_of(batch.schedule).packed_filter_elements == packed_filters * reduction // 32


def test_vector_operand_can_be_forced_and_is_validated():
    plan = plan_conv2d((1, 8, 9, 9), (40, 8, 3, 3), hardware=AVX512, vector_operand="filters")
    assert plan.vector_operand == "filters" and plan.filters_per_tile % 16 == 0
    assert plan_conv2d((1, 8, 9, 9), (40, 8, 3, 3), vector_operand="windows").vector_operand == (
        "windows"
    )
    with pytest.raises(
        ValueError, match="vector_operand must be one of 'windows', 'filters', 'reduction' or None"
    ):
        plan_conv2d((1, 8, 9, 9), (40, 8, 3, 3), vector_operand="channels")
    with pytest.raises(ValueError, match="filters_per_tile must be a multiple of the vector"):
        plan_conv2d(
            (1, 8, 9, 9),
            (40, 8, 3, 3),
            hardware=AVX512,
            vector_operand="filters",
            filters_per_tile=20,
        )


def test_plan_dict_keeps_the_vector_operand():
    plan = plan_conv2d((1, 8, 9, 9), (40, 8, 3, 3), hardware=AVX512, vector_operand="filters")
    assert Plan.from_dict(plan.to_dict()) == plan
    older = plan_conv2d(
        (1, 8, 9, 9), (40, 8, 3, 3), hardware=AVX512, vector_operand="windows"
    ).to_dict()
    del older["vector_operand"]  # a plan stored before the field existed
    assert Plan.from_dict(older).vector_operand == "windows"
    # A filter-vectorised tile read as a window-vectorised one does not exist.
    relabelled = plan.to_dict()
    del relabelled["vector_operand"]
    with pytest.raises(ValueError, match="multiple of the 16 lanes"):
        Plan.from_dict(relabelled)


def test_folding_saves_padding():
    # 49 windows in 14-wide tiles: 4 tiles an image (7 columns padded), 28 for 8 folded.
    assert tiles.folding_saves_padding(8, 49, 14)
    assert tiles.folding_saves_padding(8, 784, 32)  # 28x28 in 32-wide tiles
    assert not tiles.folding_saves_padding(8, 196, 14)  # 14x14: whole tiles already
    assert not tiles.folding_saves_padding(1, 49, 14)  # one image: nothing to fold


def test_small_planes_fold_the_batch_into_the_windows():
    x_shape, w_shape = (8, 512, 7, 7), (512, 512, 3, 3)
    # The 48 x 7 kernel pads none of 49 windows: image by image is as good.
    shape_48x7 = dict(vector_operand="filters", filters_per_tile=48, windows_per_tile=7)
    unpadded = plan_conv2d(
        x_shape, w_shape, padding=1, hardware=AVX512, filters_prepacked=True, **shape_48x7
    )
    assert unpadded.windows_per_tile == 7 and not unpadded.batch_folded
    # 32 x 14 pads 49 windows to 56; folded, 8 x 49 windows are 28 whole tiles.
    shape_32x14 = dict(vector_operand="filters", filters_per_tile=32, windows_per_tile=14)
    plan = plan_conv2d(
        x_shape, w_shape, padding=1, hardware=AVX512, filters_prepacked=True, **shape_32x14
    )
    assert plan.batch_folded
    assert (plan.image_jobs, plan.window_count) == (1, 8 * 49)
    assert plan.windows_per_tile == 14
    # Per image, the folded tiles carry no padding: 392 windows are 28 whole tiles.
    useful = 49 * 512 * 512 * 9
    assert plan.cost_of(plan.schedule).padded_macs == useful
    by_image = plan_conv2d(
        x_shape,
        w_shape,
        padding=1,
        hardware=AVX512,
        filters_prepacked=True,
        fold_batch=False,
        **shape_32x14,
    )
    assert not by_image.batch_folded and by_image.image_jobs == 8
    assert by_image.cost_of(by_image.schedule).padded_macs == 56 * 512 * 512 * 9
    assert plan.cost_of(plan.schedule).cost < by_image.cost_of(by_image.schedule).cost
    # One image, or a plane whose windows fill whole tiles, has nothing to fold.
    single = plan_conv2d((1,) + x_shape[1:], w_shape, padding=1, hardware=AVX512)
    assert not single.batch_folded and single.window_count == 49
    whole = plan_conv2d(
        (8, 256, 14, 14), (256, 256, 3, 3), padding=1, hardware=AVX512, vector_operand="filters"
    )
    assert whole.windows_per_tile == 14 and not whole.batch_folded


def test_fold_batch_is_validated_and_kept():
    with pytest.raises(ValueError, match="fold_batch"):
        plan_conv2d((2, 8, 7, 7), (8, 8, 3, 3), fold_batch="yes")
    with pytest.raises(ValueError, match="fold_batch"):
        plan_conv2d((2, 8, 7, 7), (4, 8, 7, 7), vector_operand="reduction", fold_batch=True)
    # A fully connected layer folds with a kernel that tiles windows.
    forced = plan_conv2d((3, 8, 7, 7), (4, 8, 7, 7), hardware=AVX512, fold_batch=True)
    assert forced.batch_folded and forced.vector_operand != "reduction"
    plan = plan_conv2d((3, 8, 7, 7), (40, 8, 3, 3), hardware=AVX512, fold_batch=True)
    assert plan.batch_folded and plan.window_count == 3 * 25
    assert Plan.from_dict(plan.to_dict()) == plan
    older = plan_conv2d(
        (3, 8, 7, 7), (40, 8, 3, 3), hardware=AVX512, fold_batch=False
    ).to_dict()
    del older["batch_folded"]  # a plan stored before the field existed
    assert not Plan.from_dict(older).batch_folded


def test_folded_counts_are_per_image():
    """A folded window space of N images is counted whole, then divided by N."""
    common = dict(
        channels=4,
        kernel_area=9,
        height=7,
        width=7,
        filters=8,
        windows=49,
        channel_tile=4,
        filters_per_tile=8,
        windows_per_tile=16,
        k2=1,
        k3=100,
        element_bytes=4,
        hardware=AVX512,
        batch=4,
    )
    folded = schedule_traffic("IS", images=4, **common)
    by_image = schedule_traffic("IS", **common)
    # 4 x 49 = 196 windows are 13 tiles folded, 4 x 4 = 16 image by image.
    assert folded.padded_macs == 13 * 16 * 8 * 36 // 4
    assert by_image.padded_macs == 4 * 16 * 8 * 36
    assert folded.kernel_calls == 13 // 4 and by_image.kernel_calls == 4
    # The input, the output and (shared by the batch) the filters, once, per image.
    raw, outputs, filters = 4 * 49 * 4, 8 * 49 * 4, 8 * 36 * 4
    assert folded.dram == by_image.dram == raw + outputs + filters // 4


def test_depthwise_kernel_options():
    from cso.analysis import depthwise
    from cso.geometry import make_geometry

    # Segments of 1-3 vectors (no wider than the 56 columns), each one-row and
    # in the largest block of rows the 32 registers hold without spilling,
    # split evenly.  B rows of v vectors hold B*v accumulators, 3 weights and
    # the v vectors of the B input rows that feed two FMAs or more:
    # 2B + 3 <= 32 -> 14 rows (4 blocks); 4B + 3 -> 7 (8 blocks); 6B + 3 -> 4.
    g = make_geometry((1, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144)
    assert depthwise.kernel_options(g, 16, 32) == [
        (1, 16, 1), (14, 16, 1), (1, 32, 1), (7, 32, 1), (1, 48, 1), (4, 48, 1)
    ]  # fmt: skip
    # Rows narrower than a vector: one vector; the block is the whole plane.
    small = make_geometry((1, 8, 7, 7), (8, 1, 3, 3), padding=1, groups=8)
    assert depthwise.kernel_options(small, 16, 32) == [(1, 16, 1), (7, 16, 1)]
    # Dilated down: the one-row kernel only.
    dilated = make_geometry((1, 8, 30, 30), (8, 1, 3, 3), padding=2, dilation=2, groups=8)
    assert depthwise.kernel_options(dilated, 16, 32) == [(1, 16, 1)]
    # Grouped, 8 filters a group: F of 1, 2, 4, 8 while F * vectors * rows <=
    # min(16, 32 - F * R - 2).  One vector: F = 8 fits one row (8 <= 22, one
    # row of 3x3 taps would need 8 * 3 broadcasts: min(16, 6) < 8); F = 4
    # holds a block of 16 // 4 = 4 rows (min(16, 18) = 16), F = 2 of 7
    # (min(16, 24) // 2 = 8, split evenly over 28 rows).  Two vectors: F = 8
    # needs 16 <= min(16, 22): one row.
    grouped = make_geometry((1, 64, 28, 32), (64, 8, 3, 3), padding=1, groups=8)
    assert depthwise.filter_options(grouped) == [1, 2, 4, 8]
    assert depthwise.kernel_options(grouped, 16, 32) == [
        (1, 16, 1), (14, 16, 1), (1, 16, 2), (7, 16, 2), (1, 16, 4), (4, 16, 4), (1, 16, 8),
        (1, 32, 1), (7, 32, 1), (1, 32, 2), (4, 32, 2), (1, 32, 4), (2, 32, 4), (1, 32, 8),
    ]  # fmt: skip
    # Sixteen registers (AVX2): F = 8 never fits (8 > min(8, 16 - 8 - 2)).
    assert max(f for _, _, f in depthwise.kernel_options(grouped, 8, 16)) == 4


def test_tap_live_vectors_by_hand():
    from cso.analysis import tap_rules

    # 5x5, stride 1, 14 rows: 18 input rows, the first and last feed one FMA.
    assert tap_rules.shared_input_rows(14, 5) == 16
    assert tap_rules.tap_live_vectors(14, 1, 5) == 14 + 5 + 16
    # Stride 2, 3x3: of rows 0..2B, the even ones between feed two outputs.
    assert tap_rules.shared_input_rows(4, 3, stride_h=2) == 3
    # Two filters: every loaded row feeds two FMAs or more.
    assert tap_rules.shared_input_rows(4, 3, filters=2) == 6
    assert tap_rules.tap_live_vectors(4, 1, 3, filters=2) == 8 + 6 + 6
    # One row of one filter: no row is shared.
    assert tap_rules.tap_live_vectors(1, 2, 3) == 2 + 3
    # The largest block within 32 registers: 5x5 -> 2B + 7 <= 32 -> 12 rows;
    # 7x7 -> 2B + 11 -> 10; 5x5 at stride 2 -> B + 5 + (2B - 1) -> 9.
    assert tap_rules.max_tap_rows(1, 5, 32) == 12
    assert tap_rules.max_tap_rows(1, 7, 32) == 10
    assert tap_rules.max_tap_rows(1, 5, 32, stride_h=2) == 9
    assert tap_rules.max_tap_rows(2, 5, 32) == 5
    # Several filters keep the accumulator bound alone (16 // (2 * 1)).
    assert tap_rules.max_tap_rows(1, 5, 32, filters=2) == tap_rules.max_rows_per_call(1, 5, 32, 2)
    # At least one row of one filter, however tall.
    assert tap_rules.max_tap_rows(4, 15, 32) == 1


def test_filters_a_call_divide_the_calls_not_the_work():
    from cso.analysis import depthwise
    from cso.geometry import make_geometry

    g = make_geometry((1, 64, 28, 32), (64, 8, 3, 3), padding=1, groups=8)
    one = depthwise.depthwise_traffic(g, AVX512, 4, 16, 1, 1, 1)
    four = depthwise.depthwise_traffic(g, AVX512, 4, 16, 1, 1, 4)
    # 8 filters x 28 rows x 2 segments a job, in calls of 1 and of 4 filters.
    assert one.kernel_calls == 8 * 28 * 2 and four.kernel_calls == one.kernel_calls // 4
    assert four.padded_macs == one.padded_macs == 8 * 28 * 2 * 16 * 72
    # A call's 72 column taps each load one input vector; of 4 filters, 3 more broadcasts.
    assert one.tap_loads == one.kernel_calls * 72
    assert four.tap_loads == four.kernel_calls * (72 + 3 * 72)
    assert four.cost < one.cost


def test_depthwise_tap_offsets_by_hand():
    from cso.analysis import depthwise, tap_layout
    from cso.geometry import make_geometry

    # Stride 2, dilation (1, 3), 3x3: columns q*2 + s*3 -> phase (3s) % 2, index q + 3s // 2.
    g = make_geometry(
        (1, 4, 20, 30), (4, 1, 3, 3), stride=2, padding=1, dilation=(1, 3), groups=4
    )
    segment = 16
    rows, width = tap_layout.packed_rows(g), tap_layout.phase_width(g, segment, 16)
    assert rows == (g.out_height - 1) * 2 + 2 + 1
    # One segment of 16 for 13 columns, reaching 3 on; rounded up to whole vectors.
    assert g.out_width == 13 and width == 32
    assert tap_layout.phase_width(g, segment, 1) == 16 + (2 * 3) // 2
    offsets = tap_layout.column_offsets(g, segment, 16)
    for r in range(3):
        for s, (phase, index) in enumerate([(0, 0), (1, 1), (0, 3)]):
            assert offsets[r * 3 + s] == phase * rows * width + r * width + index
    assert tap_layout.packed_channel_elements(g, segment, 16) == 2 * rows * width
    # The one-row kernel loads one vector per tap.
    assert depthwise.kernel_loads(g, 1, segment, 16) == 9
    # Four filters a call: each of the 9 columns adds 3 more broadcasts.
    assert depthwise.kernel_loads(g, 1, segment, 16, 4) == 9 + 3 * 9


def test_depthwise_row_block_offsets_and_loads_by_hand():
    from cso.analysis import depthwise, tap_layout
    from cso.geometry import make_geometry

    # 3x3, stride 2 both ways, 4 rows a call: the block reads rows 0..8.
    g = make_geometry((1, 4, 21, 80), (4, 1, 3, 3), stride=2, padding=1, groups=4)
    segment, rows_per_call = 32, 4
    assert (g.out_height, g.out_width) == (11, 40)
    # The last block starts at row 7 and ends at the last: 2 * 10 + 3 input rows.
    assert tap_layout.packed_rows(g) == (11 - 1) * 2 + 3
    rows, width = tap_layout.packed_rows(g), tap_layout.phase_width(g, segment, 1)
    # The last segment starts at column 8 and ends at the last: no column past it.
    assert width == 40 + 1 and depthwise.masked_rows(g, segment, rows_per_call) == 0
    # 7 columns, one vector of 16: its last 2 rows' lanes could run past the plane.
    narrow = make_geometry((1, 4, 9, 7), (4, 1, 3, 3), padding=1, groups=4)
    assert depthwise.masked_rows(narrow, 16, 9) == 2 and depthwise.masked_rows(narrow, 16, 1) == 1
    # Only the column taps: phase s % 2 at index s // 2.
    assert tap_layout.column_offsets(g, segment, 1, rows_per_call) == [0, rows * width, 1]
    # (4 - 1) * 2 + 3 = 9 input rows x 3 columns x 2 vectors of 16.
    assert depthwise.kernel_loads(g, rows_per_call, segment, 16) == 9 * 3 * 2
    # Two filters a call: each of the 3 columns adds R = 3 broadcasts.
    assert depthwise.kernel_loads(g, rows_per_call, segment, 16, 2) == 9 * 3 * 2 + 3 * 3
    assert tap_layout.kernel_columns(g, rows_per_call) == 3 and tap_layout.kernel_columns(g, 1) == 9


def test_depthwise_plan_is_validated():
    plan = plan_conv2d((1, 8, 9, 9), (8, 1, 3, 3), groups=8, algorithm="depthwise", hardware=AVX512)
    assert plan.algorithm == "depthwise" and plan.windows_per_tile % plan.vector_lanes == 0
    assert Plan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ValueError, match="depthwise plan needs one input channel per group"):
        dataclasses.replace(plan, geometry=plan_conv2d((1, 8, 9, 9), (8, 8, 3, 3)).geometry)


def test_ties_go_to_the_earliest_candidate():
    from cso.analysis.planner import TIE_TOLERANCE, first_within

    assert first_within([(100.5, "a"), (100.0, "b")]) == "a"  # within 1%: the first
    assert first_within([(102.0, "a"), (100.0, "b")]) == "b"
    assert first_within([(100.0, "a")], tolerance=0.0) == "a"
    assert 0 < TIE_TOLERANCE <= 0.02


@pytest.mark.parametrize(
    "x_shape, w_shape, padding",
    [
        ((1, 128, 28, 28), (512, 128, 1, 1), 0),
        ((1, 512, 7, 7), (512, 512, 3, 3), 1),
        ((1, 672, 14, 14), (112, 672, 1, 1), 0),
    ],
)
def test_the_cheapest_kernel_shape_is_taken_without_a_tolerance(x_shape, w_shape, padding):
    from cso.analysis.planner import SHAPE_TIE_TOLERANCE

    assert SHAPE_TIE_TOLERANCE == 0.0
    plan = plan_conv2d(x_shape, w_shape, padding=padding, hardware=AVX512, threads=1)
    chosen = plan.cost_of(plan.schedule).cost
    for nf, nwin in tiles.register_blocks(AVX512.vector_bytes, AVX512.vector_registers, 4):
        forced = dict(filters_per_tile=nf, windows_per_tile=nwin, vector_operand="windows")
        other = plan_conv2d(x_shape, w_shape, padding=padding, hardware=AVX512, threads=1, **forced)
        assert chosen <= other.cost_of(other.schedule).cost
