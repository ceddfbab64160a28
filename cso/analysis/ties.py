"""Near-ties between modelled costs, and the rule that breaks them."""

# Modelled costs this close are a tie: within it the planner takes the
# earliest candidate in a fixed order (the deeper channel tile, IS before
# WS, the fewer rows of a depthwise call), which ran 1-3% faster than the
# model's slightly cheaper alternatives.
TIE_TOLERANCE = 0.01
# Micro-kernel shapes tie within the same 1%, the earliest in the offered
# order (the widest window-vectorised shape first) taken.  Without a
# tolerance two calibrations of a shared Xeon planned ResNet-50's and
# VGG-16's 140 plans a little more alike (median 95.7% against 94.3% over
# 10 pairs of five calibrations), but at two threads the analysis was within
# 5% of cso.tune's best on 80-82% of model_vs_tuned.py's 85 layers (74-87%
# timed again) against 87% (89%) with it: the model prices 8x32w and 32x14f
# a few percent too low against 14x32w on layers of few windows, and the
# tie hid that.
SHAPE_TIE_TOLERANCE = TIE_TOLERANCE


def first_within(candidates, tolerance: float = TIE_TOLERANCE):
    """The first item of ``[(cost, item)]`` (in order of preference) whose
    cost is at most ``(1 + tolerance)`` times the least."""
    candidates = list(candidates)
    least = min(cost for cost, _ in candidates)
    return next(item for cost, item in candidates if cost <= least * (1 + tolerance))
