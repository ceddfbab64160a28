"""How the calibration times a probe: best of repeated runs, long enough to see."""

from __future__ import annotations

from statistics import median

from ..measure import best_times


def best_seconds(run, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``run()``, after one untimed
    call (:func:`cso.measure.best_times` of the one program)."""
    run()
    return best_times({"run": run}, repeats)["run"]


def calls_for(seconds_per_call: float, budget: float) -> int:
    """How many calls fill about ``budget`` seconds (at least one)."""
    return max(1, int(budget / max(seconds_per_call, 1e-9)))


def slope_and_intercept(xs, ys) -> tuple:
    """Least-squares ``(b, a)`` of ``y = a + b x``."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("the x values must differ")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    return slope, mean_y - slope * mean_x


def median_of(probe, times: int, *, difference: bool = False):
    """A probe that runs ``probe()`` ``times`` times and gives the median: a
    difference of two best times, or a slope, moves by more than either time.

    With ``difference``, a median smaller than half the spread of the values
    (the difference is not told apart from none) is given as 0.
    """

    def run():
        values = [probe() for _ in range(times)]
        if any(value is None for value in values):
            return None
        middle = median(values)
        if difference and times > 2 and abs(middle) < (max(values) - min(values)) / 2:
            return 0.0
        return middle

    return run


# A shape's in-place figure is sampled past its nine until the median's
# standard error is within this share of the median (or the cap is reached).
# On a Xeon the 8 x 48 kernel's samples spread 1-20 ps about a median of
# 7-11 (the difference of two 1.5 ms plans, 2% apart): its medians of nine
# read 4.2-8.9 ps in four calibrations, and 2.0 units against 4.3 moved
# three of ResNet-50's and VGG-16's 70 plans.  The 14 x 32 kernel's
# (18-19 ps, spread 2.5) take no more.
IN_PLACE_PRECISION = 0.1
IN_PLACE_MAX_SAMPLES = 36


def median_standard_error(samples) -> float:
    """``0.93 * IQR / sqrt(n)``: the standard error of a median of ``n``
    samples, from their interquartile range (``1.253 * sigma / sqrt(n)``
    for normal samples, whose ``sigma`` is ``IQR / 1.349``)."""
    ordered = sorted(samples)
    n = len(ordered)
    spread = ordered[(3 * n) // 4] - ordered[n // 4] if n >= 4 else ordered[-1] - ordered[0]
    return 0.93 * spread / n**0.5


def precise_enough(samples) -> bool:
    """Whether ``samples``' median is known to :data:`IN_PLACE_PRECISION`
    of itself (:func:`median_standard_error`), or they number
    :data:`IN_PLACE_MAX_SAMPLES`."""
    if len(samples) >= IN_PLACE_MAX_SAMPLES:
        return True
    return median_standard_error(samples) <= IN_PLACE_PRECISION * abs(median(samples))
