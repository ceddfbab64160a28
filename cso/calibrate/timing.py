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
