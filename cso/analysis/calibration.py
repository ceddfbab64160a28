"""The cost weights derived from rates measured on the machine at hand.

``python -m cso calibrate`` (:mod:`cso.calibrate`) times micro-benchmarks
and fills a :class:`~cso.analysis.rates.MeasuredRates` (re-exported here);
:func:`derive_weights` turns it into a
:class:`~cso.analysis.weights.CostWeights`, one named function per weight.
This module only computes: it measures nothing and reads no file.

The unit.  The model's weights are in one unit, a quarter of one float32
multiply-add at the FMA peak (on a core with two 16-lane FMA units and an
L1 that moves 128 bytes per cycle: one byte of L1 traffic).  With the peak
``F`` in FLOP/s one unit lasts ``u = 1 / (2 F)`` seconds, and a measured
time ``t`` weighs ``t / u``.  Every weight below is such a time, measured
for one unit of the quantity the model counts (a byte, a call, an element).
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import median

from .rates import MeasuredRates, split_width_name
from .weights import DEFAULT_WEIGHTS, CostWeights

# Significant figures the derived weights keep: the timings behind them
# spread by a few percent between runs, and finer digits would make two
# calibrations of one machine pick different plans for no reason.
SIGNIFICANT_FIGURES = 2
# A per-byte or per-element weight below this many units (1% of a float32
# multiply-add at the peak) is a difference lost in the timings' noise: it
# is taken as 0.  Measured: the L2 stream's weight came out 0 and 0.0067 in
# two calibrations of one machine, and that alone changed 28 of 70 plans.
NOISE_FLOOR = 0.04
# A micro-kernel shape gets a mac cost of its own only when its rate from L1
# is this far from the shapes' median: closer, the difference is the probe's
# noise.  Measured on an AMD EPYC (Zen 3): the 6 x 16 kernel came out at 94%
# and 96.8% of the peak in two calibrations (4x16 and 4x24 at 97-98%), and
# costs of their own then made 37 of 70 ResNet-50 and VGG-16 plans differ;
# the 8 x 8 (85%) and 16 x 6 (86%) kernels are 10% off, in every run.  On
# a shared Sapphire Rapids Xeon, with the rates timed in interleaved rounds,
# shapes came out 82-89% of the peak and a shape's distance from the median
# moved between 2% and 6% from one calibration to the next: at 5% the
# 8 x 48 kernel had a cost of its own in one of three calibrations, and
# that alone moved 14 of the 70 plans.
SHAPE_RATE_TOLERANCE = 0.08
# In-place filter reads cost a shape its own weight when it differs from the
# median's by this share of the larger (on the Zen 3: 8 x 8 24 units
# against 4.4; on the Xeon 8 x 32 11-13 against 5.5-6.7).
IN_PLACE_TOLERANCE = 0.05


def unit_seconds(fma_flops: float) -> float:
    """``u = 1 / (2 F)``: a quarter of one multiply-add (2 FLOP) at the peak ``F``."""
    return 1.0 / (2.0 * fma_flops)


def weight_of(seconds: float, fma_flops: float) -> float:
    """``t / u``: a measured time in the model's units."""
    return seconds / unit_seconds(fma_flops)


def mac_cost(rates: MeasuredRates) -> float:
    """``4 F / F_kernel``: a float32 multiply-add at the micro-kernels' rate
    (4 units at the peak, more as the kernels fall short of it)."""
    return 4.0 * rates.fma_flops / rates.kernel_flops


def kernel_mac_costs(rates: MeasuredRates) -> tuple:
    """``((shape, c_mac,shape), ...)`` for each measured micro-kernel shape
    whose rate differs from the shapes' median by more than
    :data:`SHAPE_RATE_TOLERANCE` (each :func:`rounded`); the others cost
    ``mac_cost``.

    With ``loop_shape_seconds`` (the shapes timed in the loop nest, ``t_s``
    per padded multiply-add): ``c_mac,shape = mac_cost * (1 +
    beyond_tolerance(d))`` with ``d`` the larger of ``t_s / median(t) - 1``
    and the shape's shortfall from L1 (:func:`shape_deviation`).  The loop
    nest is what the model prices: on a shared Xeon the 16 x 16 kernel ran
    at 82% of the peak from L1, as the others did, and at 44-47% in every
    ResNet-50 layer's loop nest (the others 65-75%), where the model took
    it for its lesser padding on seven of the layers.  Without (older
    records): ``4 F / F_shape`` from each shape's rate from L1.
    """
    if rates.loop_shape_seconds:
        return _loop_mac_costs(rates, rates.loop_shape_seconds, every=False)
    return tuple(
        (shape, rounded(4.0 * rates.fma_flops / flops))
        for shape, flops in rates.kernel_shape_flops
        if abs(flops / rates.kernel_flops - 1.0) > SHAPE_RATE_TOLERANCE
    )


def pointwise_mac_costs(rates: MeasuredRates) -> tuple:
    """``((shape, c_mac,shape,1x1), ...)`` for every shape timed in the loop
    nest on a 1x1 layer (``loop_pointwise_shape_seconds``), by
    :func:`kernel_mac_costs`' rule against those shapes' median
    (``mac_cost`` within the tolerance); empty where it was not measured
    (the 3x3 layer's costs then serve 1x1 layers too).

    Every shape is listed so that a shape within the tolerance on 1x1
    layers costs ``mac_cost`` there even where the 3x3 layer gave it a
    cost of its own."""
    return _loop_mac_costs(rates, rates.loop_pointwise_shape_seconds, every=True)


def shape_deviation(loop_off: float, resident_off) -> float:
    """``d = max(d_loop, d_L1)`` where ``d_L1 > 0``, else ``d_loop``: how
    much slower than the median a shape runs in the loop nest
    (``loop_off``, ``t_s / median(t) - 1``), and at least as much as it
    falls short from L1 (``resident_off``, ``median(F) / F_s - 1``; None
    where the shape's rate from L1 was not measured).

    The loop nest's figure is one state of a shared machine, and a kernel
    bound by its loads loses more when the core's sibling is busy: on an
    AMD EPYC (Zen 3) the 8 x 8 kernel (nine loads per eight FMAs, 83-84%
    of the peak from L1 against the others' 96-98%) ran 7-13% slower than
    the median shape on a 3x3 layer in quiet minutes and 21-35% in busy
    ones, and priced by the quiet figure the model took it for its lesser
    padding on ResNet-50's 3x3 layers of 7x7 outputs, 1.14-1.37x slower
    there than 6 x 16.  Its shortfall from L1 is a floor that holds in
    either state.  (Not for filter-vectorised shapes, whose rate from L1
    includes their transposed write-backs, priced apart.)"""
    if resident_off is None or resident_off <= 0:
        return loop_off
    return max(loop_off, resident_off)


def beyond_tolerance(deviation: float, tolerance: float = None) -> float:
    """``0`` for ``|d| <= tol``, ``sign(d) * 2 (|d| - tol)`` up to ``2 tol``,
    ``d`` beyond (``tol``: :data:`SHAPE_RATE_TOLERANCE`).

    Continuous, so that noise near the tolerance moves a cost a little, not
    by the tolerance (on a Xeon, 48x7f read 7.9% and 8.5% past the median
    in two calibrations, and costing it 8.5% more in the second moved six
    ResNet-50 layers of 7x7 outputs to 32x14f, 4-15% slower there: 61 of 70
    plans alike, 67 with a continuous rule), and whole beyond twice the
    tolerance, so that a shape far off is priced at what it loses (with
    ``|d| - tol`` throughout, a shape 13% slower cost 5% more)."""
    tolerance = SHAPE_RATE_TOLERANCE if tolerance is None else tolerance
    size = abs(deviation)
    if size <= tolerance:
        return 0.0
    if size < 2 * tolerance:
        return math.copysign(2 * (size - tolerance), deviation)
    return deviation


def _loop_mac_costs(rates: MeasuredRates, loop_seconds, every: bool) -> tuple:
    """The shapes of ``loop_seconds`` past the tolerance (``every``: all of
    them, the others at ``mac_cost``) with their costs by
    :func:`kernel_mac_costs`' rule."""
    if not loop_seconds:
        return ()
    middle = median(seconds for _, seconds in loop_seconds)
    resident = dict(rates.kernel_shape_flops)
    resident_middle = median(resident.values()) if resident else None
    base = mac_cost(rates)
    costs = []
    for shape, seconds in loop_seconds:
        # A filter-vectorised shape's rate from L1 includes its transposed
        # write-backs (a sixth of the 16 x 6 kernel's call at the depth the
        # probe runs), which transposed_store_cost prices apart: no floor.
        floored = shape in resident and not shape.endswith("f")
        resident_off = resident_middle / resident[shape] - 1.0 if floored else None
        beyond = beyond_tolerance(shape_deviation(seconds / middle - 1.0, resident_off))
        if beyond or every:
            costs.append((shape, rounded(base * (1.0 + beyond))))
    return tuple(costs)


def kernel_in_place_costs(rates: MeasuredRates) -> tuple:
    """``((shape, t_in_place,shape / u), ...)``: :func:`in_place_filter_cost`
    of each measured shape (each :func:`rounded`), for the shapes whose cost
    differs from the median's by more than :data:`IN_PLACE_TOLERANCE` of
    the larger of the two."""
    median_cost = rounded(in_place_filter_cost(rates))
    costs = (
        (shape, rounded(weight_of(seconds, rates.fma_flops)))
        for shape, seconds in rates.in_place_shape_seconds
    )
    return tuple(
        (shape, cost)
        for shape, cost in costs
        if abs(cost - median_cost) > IN_PLACE_TOLERANCE * max(cost, median_cost)
    )


def pointwise_in_place_costs(rates: MeasuredRates) -> tuple:
    """``((shape, t_in_place,shape,1x1 / u), ...)``: each shape's in-place
    filter read on a 1x1 layer (``in_place_pointwise_shape_seconds``),
    :func:`rounded`, every measured shape listed (a shape near the median
    on 1x1 layers still costs its own there, not the 3x3 layer's); empty
    where it was not measured (the 3x3 layer's costs then serve 1x1 layers
    too)."""
    return tuple(
        (shape, rounded(weight_of(seconds, rates.fma_flops)))
        for shape, seconds in rates.in_place_pointwise_shape_seconds
    )


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


def input_pack_cost(rates: MeasuredRates) -> float:
    """``t_input / u``, per packed input element."""
    return weight_of(rates.input_pack_seconds, rates.fma_flops)


def input_pack_costs(rates: MeasuredRates) -> tuple:
    """``((kind, t_input,kind / u), ...)``: :func:`input_pack_cost` of each
    measured kind of input packing (each :func:`rounded`), every kind kept:
    a kind's figure moves less between calibrations than the median over
    kinds, which jumps from one kind's figure to another's.  A kind also
    measured at two output widths takes the intercept ``a`` of
    :func:`input_pack_width_fit` instead."""
    fits = input_pack_width_fit(rates)
    return tuple(
        (kind, rounded(fits[kind][0] if kind in fits else weight_of(seconds, rates.fma_flops)))
        for kind, seconds in rates.input_pack_kind_seconds
    )


def input_pack_row_costs(rates: MeasuredRates) -> tuple:
    """``((kind, b), ...)``: the per-row term of each kind measured at two
    output widths (:func:`input_pack_width_fit`, each :func:`rounded`)."""
    return tuple(
        (kind, rounded(row)) for kind, (_, row) in sorted(input_pack_width_fit(rates).items())
    )


def input_pack_width_fit(rates: MeasuredRates) -> dict:
    """``{kind: (a, b)}``: ``t(Q) / u = a + b / Q`` through a kind's two
    measurements at output widths ``Q_1 > Q_2`` (``input_pack_width_seconds``):
    ``b = (c_2 - c_1) / (1/Q_2 - 1/Q_1)``, ``a = c_1 - b / Q_1``, with ``b``
    and ``a`` at least 0 (``a`` then ``c_1``'s share not explained by
    ``b``).  A panel row is copied in segments no longer than the output
    row, each with a fixed cost: on an AMD EPYC (Zen 3) the shifted copies
    cost 0.21, 0.41, 0.67 and 1.10 ns an element at 56, 28, 14 and 7
    columns, which ``a + b / Q`` through 56 and 7 puts within 12%."""
    by_kind = {}
    for name, seconds in rates.input_pack_width_seconds:
        kind, columns = split_width_name(name)
        by_kind.setdefault(kind, []).append((columns, weight_of(seconds, rates.fma_flops)))
    fits = {}
    for kind, points in by_kind.items():
        if len(points) < 2:
            continue
        (wide, wide_cost), (narrow, narrow_cost) = max(points), min(points)
        if wide == narrow:
            continue
        row = max(0.0, (narrow_cost - wide_cost) / (1 / narrow - 1 / wide))
        fits[kind] = (max(0.0, wide_cost - row / wide), row)
    return fits


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


def filter_tile_pack_cost(rates: MeasuredRates) -> float:
    """``t_tile / u``, per filter element packed tile by tile in the loop
    nest; ``filter_pack_cost`` where it was not measured (older records)."""
    if rates.filter_tile_pack_seconds:
        return weight_of(rates.filter_tile_pack_seconds, rates.fma_flops)
    return filter_pack_cost(rates)


def in_place_filter_cost(rates: MeasuredRates) -> float:
    """``t_in_place / u``, per filter element read in place."""
    return weight_of(rates.in_place_filter_seconds, rates.fma_flops)


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


def row_call_cost(rates: MeasuredRates) -> float:
    """``t_row / u``, per row-kernel call in its loop nest; in records made
    before it was measured, the tap kernel's call cost (:func:`tap_call_cost`)."""
    return _nest_call_cost(rates.row_call_seconds, rates)


def plane_call_cost(rates: MeasuredRates) -> float:
    """``t_plane / u``, per plane-kernel call in its loop nest; in records made
    before it was measured, the tap kernel's call cost (:func:`tap_call_cost`)."""
    return _nest_call_cost(rates.plane_call_seconds, rates)


def unpacked_load_cost(rates: MeasuredRates) -> float:
    """``(t_column / u - macs_column * c_mac) / loads_column``: per vector
    load of the kernels that read the planes as given (row and plane), what
    a column of taps adds to a row-kernel call in its nest beyond its
    multiply-adds (:func:`mac_cost`), over the loads it adds.  0 where not
    measured (records made before it was): the tap kernel's load rate then
    stands in (:func:`~cso.analysis.depthwise.tap_kernel_cost`).

    Why not the tap kernel's: its probe chains each vector's FMAs (four
    chains), so its pair of load and FMA is an FMA latency; the row kernel's
    whole loads, masked by an and, cost less than that (on a Zen 3 the model
    so priced row plans 1.3x dearer than lane plans they ran 1.27x faster
    than)."""
    if not (rates.row_column_seconds and rates.row_column_loads):
        return 0.0
    added = weight_of(rates.row_column_seconds, rates.fma_flops)
    return max(0.0, (added - rates.row_column_macs * mac_cost(rates)) / rates.row_column_loads)


def lane_transpose_cost(rates: MeasuredRates) -> float:
    """``t_lane / u``, per element the lane nest transposes; in records made
    before it was measured, the shifted input packing's cost (a pass of
    vector loads and stores like it, which the lane model was priced with)."""
    if rates.lane_transpose_seconds:
        return weight_of(rates.lane_transpose_seconds, rates.fma_flops)
    return dict(input_pack_costs(rates)).get("shifted", input_pack_cost(rates))


def rounded(value: float, figures: int = SIGNIFICANT_FIGURES) -> float:
    """``value`` to ``figures`` significant figures; 0 below :data:`NOISE_FLOOR`."""
    if abs(value) < NOISE_FLOOR:
        return 0.0
    return round(value, figures - 1 - int(math.floor(math.log10(abs(value)))))


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
    "filter_tile_pack_cost": filter_tile_pack_cost,
    "in_place_filter_cost": in_place_filter_cost,
    "tap_call_cost": tap_call_cost,
    "tap_load_cost": tap_load_cost,
    "lane_transpose_cost": lane_transpose_cost,
    "row_call_cost": row_call_cost,
    "plane_call_cost": plane_call_cost,
    "unpacked_load_cost": unpacked_load_cost,
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
