"""The weights a calibration derives per micro-kernel shape and per kind of
input packing (:mod:`.calibration`'s tables), and the shared weight each
table refines: ``mac_cost`` (``kernel_mac_costs``, ``pointwise_mac_costs``),
``in_place_filter_cost`` (``kernel_in_place_costs``,
``pointwise_in_place_costs``) and ``input_pack_cost`` (``input_pack_costs``,
``input_pack_row_costs``).  A shape or kind gets a weight of its own only
where it stands out of the timings' noise (the tolerances below).
"""

from __future__ import annotations

import math
from statistics import median

from .calibration_units import rounded, weight_of
from .rates import MeasuredRates, split_width_name

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


def in_place_filter_cost(rates: MeasuredRates) -> float:
    """``t_in_place / u``, per filter element read in place."""
    return weight_of(rates.in_place_filter_seconds, rates.fma_flops)


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
