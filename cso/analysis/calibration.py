"""The cost weights derived from rates measured on the machine at hand.

``python -m cso calibrate`` (:mod:`cso.calibrate`) times micro-benchmarks
and fills a :class:`~cso.analysis.rates.MeasuredRates` (re-exported here);
:func:`derive_weights` turns it into a
:class:`~cso.analysis.weights.CostWeights`, one named function per weight.
The per-shape and per-kind tables, with the shared weight each refines,
are derived in :mod:`.calibration_tables`; the unit and the rounding in
:mod:`.calibration_units` (their names are re-exported here).
This module only computes: it measures nothing and reads no file.

The unit.  The model's weights are in one unit, a quarter of one float32
multiply-add at the FMA peak (:func:`unit_seconds`).  Every weight below is
a time measured for one unit of the quantity the model counts (a byte, a
call, an element), in that unit.
"""

from __future__ import annotations

from dataclasses import replace

from .calibration_tables import (
    IN_PLACE_TOLERANCE,
    SHAPE_RATE_TOLERANCE,
    beyond_tolerance,
    in_place_filter_cost,
    input_pack_cost,
    input_pack_costs,
    input_pack_row_costs,
    input_pack_width_fit,
    kernel_in_place_costs,
    kernel_mac_costs,
    mac_cost,
    pointwise_in_place_costs,
    pointwise_mac_costs,
    shape_deviation,
)
from .calibration_units import NOISE_FLOOR, SIGNIFICANT_FIGURES, rounded, unit_seconds, weight_of
from .rates import MeasuredRates
from .weights import DEFAULT_WEIGHTS, CostWeights

# Re-exported: the calibration's names, wherever they are derived.
__all__ = [
    "CALIBRATED_WEIGHTS",
    "FORMULAS",
    "IN_PLACE_TOLERANCE",
    "MeasuredRates",
    "NOISE_FLOOR",
    "SHAPE_RATE_TOLERANCE",
    "SIGNIFICANT_FIGURES",
    "beyond_tolerance",
    "derive_weights",
    "input_pack_width_fit",
    "rounded",
    "shape_deviation",
    "unit_seconds",
    "weight_of",
]


def l2_cost(rates: MeasuredRates) -> float:
    """``0`` with the shapes timed in the loop nest, else ``t_L2stream / u``:
    what a byte streamed from L2 adds to the kernels.

    The loop-nest probe (``loop_shape_seconds``) times each micro-kernel
    shape on a layer as the nests run it, its operand streaming from L2: a
    shape whose stream costs it more runs slower there and is priced so
    (:func:`kernel_mac_costs`).  Charging the L2 bytes again counted the
    stream twice, and it was the weight two calibrations disagreed on most:
    the least extra over the shapes from L1, ``t_L2stream``, came out 0 in
    one calibration and 1.7 ps/byte (0.8 units) in the next on a Xeon, and
    that alone changed 28 of 70 ResNet-50 and VGG-16 plans (8 x 48 to
    32 x 14 with its filters packed per call; those layers ran 1.04x slower
    in all).  With 0, model / oracle (``experiments/forced_shapes.py``) went
    from 1.013, 1.025, 1.036, 1.004 to 1.003, 1.009, 1.014, 1.009 (ResNet-50
    and VGG-16 at one and two threads).  Records without the loop-nest
    timings keep the kernel probe's figure."""
    if rates.loop_shape_seconds:
        return 0.0
    return weight_of(rates.l2_stream_seconds_per_byte, rates.fma_flops)


def l3_cost(rates: MeasuredRates) -> float:
    """``(1 / B_L3) / u``: a byte at L3's streaming bandwidth, one core."""
    return weight_of(1.0 / rates.l3_bytes_per_second, rates.fma_flops)


def dram_cost(rates: MeasuredRates) -> float:
    """``(1 / B_DRAM) / u``: a byte at DRAM's streaming bandwidth, one core."""
    return weight_of(1.0 / rates.dram_bytes_per_second, rates.fma_flops)


def l3_shared_cost(rates: MeasuredRates) -> float:
    """``(1 / B_L3,shared) / u``: a byte from L3 while every core streams."""
    return weight_of(1.0 / rates.l3_shared_bytes_per_second, rates.fma_flops)


def dram_shared_cost(rates: MeasuredRates) -> float:
    """``(1 / B_DRAM,shared) / u``: a byte from DRAM while every core streams."""
    return weight_of(1.0 / rates.dram_shared_bytes_per_second, rates.fma_flops)


def l1_miss_cost(rates: MeasuredRates) -> float:
    """``t_spill / u``: a byte of a stationary tile read from L2 at every call."""
    return weight_of(rates.l1_spill_seconds_per_byte, rates.fma_flops)


def l1_conflict_cost(rates: MeasuredRates) -> float:
    """``t_line / u``: a filter read whose line is reloaded from L2."""
    return weight_of(rates.l2_line_reload_seconds, rates.fma_flops)


def tlb_miss_cost(rates: MeasuredRates) -> float:
    """``t_miss / u``."""
    return weight_of(rates.tlb_miss_seconds, rates.fma_flops)


def call_cost(rates: MeasuredRates) -> float:
    """``t_call / u``."""
    return weight_of(rates.kernel_call_seconds, rates.fma_flops)


def transposed_store_cost(rates: MeasuredRates) -> float:
    """``t_store / u``, per output element."""
    return weight_of(rates.transposed_store_seconds, rates.fma_flops)


def filter_pack_cost(rates: MeasuredRates) -> float:
    """``t_filter / u``, per packed filter element."""
    return weight_of(rates.filter_pack_seconds, rates.fma_flops)


def filter_pack_shared_cost(rates: MeasuredRates) -> float:
    """``t_filter,shared / u``, per filter element packed in a call whose
    workers each read every panel (thread time); ``filter_pack_cost`` where
    it was not measured (older records, one core)."""
    if rates.filter_pack_shared_seconds:
        return weight_of(rates.filter_pack_shared_seconds, rates.fma_flops)
    return filter_pack_cost(rates)


def filter_pack_call_cost(rates: MeasuredRates) -> float:
    """``max(0, t_call - E * t_filter) / u``: the small layer's per-call
    packing (``filter_pack_call_seconds``) beyond its ``E`` elements at the
    per-element rate (``filter_pack_seconds``), the fixed part of packing a
    call's panels up front; 0 where it was not measured (older records)."""
    if not rates.filter_pack_call_seconds:
        return 0.0
    fixed = (
        rates.filter_pack_call_seconds
        - rates.filter_pack_call_elements * rates.filter_pack_seconds
    )
    return weight_of(max(0.0, fixed), rates.fma_flops)


def filter_tile_pack_cost(rates: MeasuredRates) -> float:
    """``t_tile / u``, per filter element packed tile by tile in the loop
    nest; ``filter_pack_cost`` where it was not measured (older records)."""
    if rates.filter_tile_pack_seconds:
        return weight_of(rates.filter_tile_pack_seconds, rates.fma_flops)
    return filter_pack_cost(rates)


def tap_call_cost(rates: MeasuredRates) -> float:
    """``t_tap / u``."""
    return weight_of(rates.tap_call_seconds, rates.fma_flops)


def tap_load_cost(rates: MeasuredRates) -> float:
    """``t_load / u``, per input vector the tap kernel loads."""
    return weight_of(rates.tap_load_seconds, rates.fma_flops)


def _nest_call_cost(seconds: float, rates: MeasuredRates) -> float:
    """``seconds / u``, or :func:`tap_call_cost` where ``seconds`` was not
    measured (0: records made before it was)."""
    return weight_of(seconds, rates.fma_flops) if seconds else tap_call_cost(rates)


def tap_nest_call_cost(rates: MeasuredRates) -> float:
    """``t_tap_nest / u``, per call of the tap nest (its intercept on wide
    planes, whose calls share a plane's work and packing 266 ways); 0 where
    not measured (the tap kernel's :func:`tap_call_cost` then prices the
    calls).

    The tap kernel's own probe calls it over constant operands, 0.36 ns a
    call on an AMD EPYC (Zen 3); in its nest a call cost 12.5-18 ns there
    (25-26 on 28x28 planes, 51-60 on 7x7), and priced at the probe's figure
    the tap plans of MobileNetV2's and EfficientNet-B0's layers, and of
    ConvBench's, were taken where row plans ran 1.3-1.6x faster."""
    return weight_of(rates.tap_nest_call_seconds, rates.fma_flops)


def row_job_seconds(rates: MeasuredRates) -> float:
    """``t_job = (I_n - I_w) / (1/n_n - 1/n_w)``: a plane's own time in the
    row nest, from the call intercepts ``I`` on planes of ``n`` calls each
    (``row_call_seconds`` on 7x7 planes, one call; ``row_wide_call_seconds``
    on 112x112 planes, 112), each ``I = t_call + t_job / n``; 0 where the
    wide planes were not measured, or the intercepts do not fall with
    ``n``."""
    narrow, wide = rates.row_calls_per_plane, rates.row_wide_calls_per_plane
    if not (rates.row_wide_call_seconds and narrow and wide and wide > narrow):
        return 0.0
    spread = 1.0 / narrow - 1.0 / wide
    return max(0.0, (rates.row_call_seconds - rates.row_wide_call_seconds) / spread)


def row_job_cost(rates: MeasuredRates) -> float:
    """``t_job / u`` (:func:`row_job_seconds`), per plane the row nest runs.

    Without it a call was priced at the 7x7 planes' intercept, which holds
    their plane's work: on an AMD EPYC (Zen 3) 51-72 ns against 18-19 on
    112x112 planes and 37 on 14x14, and the model took the tap family for
    ResNet-50-like 3x3 layers of 32 channels @112 and 384-576 @14, which
    ran 1.36-1.56x and 1.4x slower there than the row plans."""
    return weight_of(row_job_seconds(rates), rates.fma_flops)


def row_call_cost(rates: MeasuredRates) -> float:
    """``(I_w - t_job / n_w) / u``, per row-kernel call in its loop nest, its
    plane's work (:func:`row_job_cost`) apart; ``I_n / u`` (the 7x7 planes'
    intercept, plane and call together) in records without the wide planes;
    in records made before either was measured, the tap kernel's call cost
    (:func:`tap_call_cost`)."""
    job = row_job_seconds(rates)
    if not job:
        return _nest_call_cost(rates.row_call_seconds, rates)
    call = rates.row_wide_call_seconds - job / rates.row_wide_calls_per_plane
    return weight_of(max(0.0, call), rates.fma_flops)


def plane_call_cost(rates: MeasuredRates) -> float:
    """``t_plane / u``, per plane-kernel call in its loop nest; in records made
    before it was measured, the tap kernel's call cost (:func:`tap_call_cost`)."""
    return _nest_call_cost(rates.plane_call_seconds, rates)


def _column_load_cost(rates: MeasuredRates, seconds: float, macs: float, loads: float) -> float:
    """``(t_column / u - macs_column * c_mac) / loads_column``, 0 where the
    column was not measured (``seconds`` or ``loads`` 0)."""
    if not (seconds and loads):
        return 0.0
    added = weight_of(seconds, rates.fma_flops)
    return max(0.0, (added - macs * mac_cost(rates)) / loads)


def unpacked_load_cost(rates: MeasuredRates) -> float:
    """``(t_column / u - macs_column * c_mac) / loads_column``: per vector
    load of the row kernel (and of the plane kernel where
    :func:`plane_load_cost` was not measured), what
    a column of taps adds to a row-kernel call in its nest beyond its
    multiply-adds (:func:`mac_cost`), over the loads it adds.  0 where not
    measured (records made before it was): the tap kernel's load rate then
    stands in (:func:`~cso.analysis.depthwise.tap_kernel_cost`).

    Why not the tap kernel's: its probe chains each vector's FMAs (four
    chains), so its pair of load and FMA is an FMA latency; the row kernel's
    whole loads, masked by an and, cost less than that (on a Zen 3 the model
    so priced row plans 1.3x dearer than lane plans they ran 1.27x faster
    than)."""
    return _column_load_cost(
        rates, rates.row_column_seconds, rates.row_column_macs, rates.row_column_loads
    )


def plane_load_cost(rates: MeasuredRates) -> float:
    """``(t_column / u - macs_column * c_mac) / loads_column`` of the plane
    nest's column of taps: per vector load of the plane kernel, as
    :func:`unpacked_load_cost` is the row kernel's.  0 where not measured
    (the row kernel's then stands in: :func:`~cso.analysis.planes.plane_traffic`).

    Why apart: the plane kernel's loads are masked loads of bit-set masks
    (a mask read beside each) where the row kernel's are whole loads and an
    and.  On an AMD EPYC (Zen 5, AVX-512), one thread, with the row
    kernel's rate for both, the model took the plane plans for
    EfficientNet-B0's ``dw 5x5 1152 @7`` and ``dw 3x3 1152 @7``, which ran
    2.75x and 1.46x slower than the lane plans (88.7 and 32.2 us against
    32.2 and 22.1)."""
    return _column_load_cost(
        rates, rates.plane_column_seconds, rates.plane_column_macs, rates.plane_column_loads
    )


def lane_transpose_cost(rates: MeasuredRates) -> float:
    """``t_lane / u``, per element the lane nest transposes; in records made
    before it was measured, the shifted input packing's cost (a pass of
    vector loads and stores like it, which the lane model was priced with)."""
    if rates.lane_transpose_seconds:
        return weight_of(rates.lane_transpose_seconds, rates.fma_flops)
    return dict(input_pack_costs(rates)).get("shifted", input_pack_cost(rates))


def in_place_input_cost(rates: MeasuredRates) -> float:
    """``t_in_place_input / u``, per input element a micro-kernel reads in
    place instead of from a packed panel (0 in records made before it was
    measured: the input is then read in place wherever it may be)."""
    return weight_of(rates.in_place_input_seconds, rates.fma_flops)


def kernel_prefetch_distance(prefetch_speedup: float, default: int) -> int:
    """``Hardware.kernel_prefetch_distance`` of a measured
    ``MeasuredRates.prefetch_speedup``: 0 where the loop nests ran faster
    without the kernels' software prefetch (``0 < prefetch_speedup < 1``),
    else ``default`` (also where it was not measured, 0).  No margin: the
    plans do not depend on it, so where the two ways are even a calibration
    taking either changes no plan and costs nothing."""
    return 0 if 0 < prefetch_speedup < 1 else default


# Each calibrated weight and the formula that derives it.
FORMULAS = {
    "mac_cost": mac_cost,
    "l2_cost": l2_cost,
    "l3_cost": l3_cost,
    "dram_cost": dram_cost,
    "l3_shared_cost": l3_shared_cost,
    "dram_shared_cost": dram_shared_cost,
    "l1_miss_cost": l1_miss_cost,
    "l1_conflict_cost": l1_conflict_cost,
    "tlb_miss_cost": tlb_miss_cost,
    "call_cost": call_cost,
    "transposed_store_cost": transposed_store_cost,
    "input_pack_cost": input_pack_cost,
    "filter_pack_cost": filter_pack_cost,
    "filter_pack_shared_cost": filter_pack_shared_cost,
    "filter_pack_call_cost": filter_pack_call_cost,
    "filter_tile_pack_cost": filter_tile_pack_cost,
    "in_place_filter_cost": in_place_filter_cost,
    "in_place_input_cost": in_place_input_cost,
    "tap_call_cost": tap_call_cost,
    "tap_load_cost": tap_load_cost,
    "lane_transpose_cost": lane_transpose_cost,
    "row_call_cost": row_call_cost,
    "row_job_cost": row_job_cost,
    "tap_nest_call_cost": tap_nest_call_cost,
    "plane_call_cost": plane_call_cost,
    "unpacked_load_cost": unpacked_load_cost,
    "plane_load_cost": plane_load_cost,
}
# The weights derive_weights measures; the rest keep their defaults.
CALIBRATED_WEIGHTS = tuple(FORMULAS)


def derive_weights(rates: MeasuredRates) -> CostWeights:
    """The :class:`CostWeights` of ``rates``: each of :data:`FORMULAS`,
    :func:`rounded`, each shape's :func:`kernel_mac_costs` (and
    :func:`pointwise_mac_costs`) and
    :func:`kernel_in_place_costs` (and :func:`pointwise_in_place_costs`),
    and each packing kind's
    :func:`input_pack_costs`; ``origin`` is ``"calibrated"``.

    ``sweep_fraction`` and ``stream_overlap`` keep their defaults: they are
    shares of the model's own counts (how much of a cache a swept block may
    take, how much of a stream hides behind the FMAs), set by comparing
    plans (``experiments/cost_weight.py``), not rates of the machine.
    """
    derived = {name: rounded(formula(rates)) for name, formula in FORMULAS.items()}
    return replace(
        DEFAULT_WEIGHTS,
        **derived,
        kernel_mac_costs=kernel_mac_costs(rates),
        pointwise_mac_costs=pointwise_mac_costs(rates),
        kernel_in_place_costs=kernel_in_place_costs(rates),
        pointwise_in_place_costs=pointwise_in_place_costs(rates),
        input_pack_costs=input_pack_costs(rates),
        input_pack_row_costs=input_pack_row_costs(rates),
        origin="calibrated",
    )
