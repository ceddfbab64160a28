"""Near-ties between modelled costs, and the rule that breaks them."""

# Modelled costs this close are a tie: within it the planner takes the
# earliest candidate in a fixed order (the deeper channel tile, IS before
# WS, the fewer rows of a depthwise call), which ran 1-3% faster than the
# model's slightly cheaper alternatives.
TIE_TOLERANCE = 0.01
# Micro-kernel shapes are not tied: the cheapest is taken.  A tolerance
# there was meant to keep plans alike between calibrations (the weights
# move by 5-30% from one to the next), and did the opposite: over 15 pairs
# of six calibrations of a shared Xeon, ResNet-50's and VGG-16's 140
# plans at one and two threads agreed on 81-96% with 1% (the shape
# earliest in the offered order) and 94-100% with none; the plans that
# differ ran 1.000x and 0.997x as fast in all (five models, one and two
# threads, side by side).
SHAPE_TIE_TOLERANCE = 0.0


def first_within(candidates, tolerance: float = TIE_TOLERANCE):
    """The first item of ``[(cost, item)]`` (in order of preference) whose
    cost is at most ``(1 + tolerance)`` times the least."""
    candidates = list(candidates)
    least = min(cost for cost, _ in candidates)
    return next(item for cost, item in candidates if cost <= least * (1 + tolerance))
