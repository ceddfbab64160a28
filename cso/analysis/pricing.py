"""What a plan moves, and its price: the counts every family's model fills
in (:class:`Traffic`) and the weighted sum that turns them into one cost
(:func:`weighted_cost`), with the rules shared by the families: which L3
and DRAM rates apply, what packing filters in a call costs, and how much
of WS's filter stream hides behind the FMAs.

The dense schedules' counts are in :mod:`.cost`; the tap, lane, plane and
row families' in their own modules (:mod:`.depthwise`, :mod:`.lanes`,
:mod:`.planes`, :mod:`.rows`).  Every weight is a field of
:class:`~cso.analysis.weights.CostWeights`, measured by
``python -m cso calibrate`` (:mod:`.calibration`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .choices import Schedule


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
    in_place_input_reads: int = 0
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


def up_front_packing_cost(weights, threads: int, shares: int) -> float:
    """``c_pack,call * T / J``: the fixed part of packing a call's filter
    panels up front (``CostWeights.filter_pack_call_cost``), run by the
    calling thread while the call's other ``T - 1`` workers wait (so ``T``
    workers' time), over the call's ``J`` (group, image) pairs, each priced
    apart."""
    return weights.filter_pack_call_cost * threads / max(1, shares)


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
    in_place_input_reads=0,
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
    + inputs*c_input + reads*c_in_place + conflicts*c_conflict
    + input_reads*c_in_place_input - hidden``
    (a float64 MAC takes two float32
    lanes; ``stores`` are transposed element stores, ``packed`` filter
    elements packed in the call, ``inputs`` input elements packed into
    panels, ``reads`` filter elements read in place, ``conflicts`` those of
    them whose line L1 associativity evicted (:func:`conflicting_filter_reads`),
    ``input_reads`` input elements read in place
    (``CostWeights.in_place_input_cost``), ``hidden`` the streams' overlap
    with the FMAs, :func:`hidden_stream_cost`).  The counts
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
        + in_place_input_reads * hardware.weights.in_place_input_cost
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
