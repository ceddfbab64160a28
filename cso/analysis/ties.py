"""Near-ties between modelled costs, and the rule that breaks them."""

# Modelled costs this close are a tie.  The weights are measured to a few
# percent (two calibrations of one machine give single weights 5-30% apart),
# and near-ties between kernel shapes flipped with them: 14 of ResNet-50's
# and VGG-16's 70 plans at one and two threads between two calibrations.
# Within it the planner takes the earliest candidate in a fixed order.
TIE_TOLERANCE = 0.01


def first_within(candidates, tolerance: float = TIE_TOLERANCE):
    """The first item of ``[(cost, item)]`` (in order of preference) whose
    cost is at most ``(1 + tolerance)`` times the least."""
    candidates = list(candidates)
    least = min(cost for cost, _ in candidates)
    return next(item for cost, item in candidates if cost <= least * (1 + tolerance))
