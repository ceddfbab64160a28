"""The cost model's unit, and the rounding every derived weight takes.

The model's weights are in one unit, a quarter of one float32 multiply-add
at the FMA peak (on a core with two 16-lane FMA units and an L1 that moves
128 bytes per cycle: one byte of L1 traffic).  With the peak ``F`` in
FLOP/s one unit lasts ``u = 1 / (2 F)`` seconds, and a measured time ``t``
weighs ``t / u``.
"""

from __future__ import annotations

import math

def unit_seconds(fma_flops: float) -> float:
    """``u = 1 / (2 F)``: a quarter of one multiply-add (2 FLOP) at the peak ``F``."""
    return 1.0 / (2.0 * fma_flops)


def weight_of(seconds: float, fma_flops: float) -> float:
    """``t / u``: a measured time in the model's units."""
    return seconds / unit_seconds(fma_flops)


# Significant figures the derived weights keep: the timings behind them
# spread by a few percent between runs, and finer digits would make two
# calibrations of one machine pick different plans for no reason.
SIGNIFICANT_FIGURES = 2
# A per-byte or per-element weight below this many units (1% of a float32
# multiply-add at the peak) is a difference lost in the timings' noise: it
# is taken as 0.  Measured: the L2 stream's weight came out 0 and 0.0067 in
# two calibrations of one machine, and that alone changed 28 of 70 plans.
NOISE_FLOOR = 0.04


def rounded(value: float, figures: int = SIGNIFICANT_FIGURES) -> float:
    """``value`` to ``figures`` significant figures; 0 below :data:`NOISE_FLOOR`."""
    if abs(value) < NOISE_FLOOR:
        return 0.0
    return round(value, figures - 1 - int(math.floor(math.log10(abs(value)))))
