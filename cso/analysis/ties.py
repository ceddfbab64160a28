"""Near-ties between modelled costs, and the rule that breaks them."""

# Modelled costs this close are a tie: within it the planner takes the
# earliest candidate in a fixed order (the deeper channel tile, IS before
# WS, one row a depthwise call before a block).  Without it, ResNet-50's
# `l2 3x3 128 @28` and `l2 3x3/2 128 @56` at two threads took 43-channel
# tiles the model put under 1% cheaper than 64, and ran 1.4-2.7% slower.
TIE_TOLERANCE = 0.01
# Micro-kernel shapes are not tied: the cheapest is taken.  A tolerance
# there was meant to keep plans alike between calibrations (the weights
# move by 5-30% from one to the next), and did not: on a shared Xeon,
# ResNet-50's and VGG-16's 140 plans at one and two threads agreed between
# two of six calibrations on 87.1-100% (median 94.3%, 6 of 15 pairs at 95%
# or more) with 1% (the shape earliest in the offered order) and on
# 92.9-100% (median 97.1%, 11 of 15) with none, and ResNet-50 per call ran
# 1.05x torch at one thread without it against
# 1.03-1.04x with it (two and three runs).  What the 1% did better: at two
# threads the analysis was within 5% of cso.tune's best on 87% (89% timed
# again) of model_vs_tuned.py's 85 layers against 80-82% (74-87%): the model
# prices 8x32w and 32x14f a few percent too low against 14x32w on layers of
# few windows, which the tie hid.
SHAPE_TIE_TOLERANCE = 0.0


def first_within(candidates, tolerance: float = TIE_TOLERANCE):
    """The first item of ``[(cost, item)]`` (in order of preference) whose
    cost is at most ``(1 + tolerance)`` times the least."""
    candidates = list(candidates)
    least = min(cost for cost, _ in candidates)
    return next(item for cost, item in candidates if cost <= least * (1 + tolerance))
