"""The algorithm families besides dense: which layers each runs (and what
that is, as the error for a family forced on a layer it cannot run says),
and its planner.  The planner (:mod:`.planner`) weighs every family that
runs a layer against the dense plans.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from . import tap_rules
from .choices import Algorithm
from .depthwise import is_depthwise, plan_depthwise
from .lanes import is_lane_depthwise, plan_lanes
from .planes import is_plane_depthwise, plan_planes
from .rows import MAX_ROW_STRIDE, is_row_depthwise, plan_rows
from .winograd import plan_winograd, streams_filters_once
from .winograd_rules import is_winograd


class Family(NamedTuple):
    """An algorithm family besides dense: which layers it runs (and what
    that is, as its error says), its planner, ``plan(geometry, dtype_name,
    hardware, threads, filters_prepacked)``, and whether the model may take
    one of its plans unforced (``takes(plan)``; None: always)."""

    runs: Callable
    needs: str
    plan: Callable
    takes: Callable = None


FAMILIES = {
    Algorithm.DEPTHWISE: Family(
        is_depthwise, "one input channel per group (groups == C > 1)", plan_depthwise
    ),
    Algorithm.GROUPED: Family(
        tap_rules.is_small_grouped,
        f"more than one group of 2 to {tap_rules.MAX_GROUP_CHANNELS} channels",
        plan_depthwise,
    ),
    Algorithm.DEPTHWISE_LANES: Family(
        is_lane_depthwise,
        "one input channel and one filter per group (groups == C == K > 1), filters at "
        f"most {tap_rules.MAX_LANE_KERNEL_WIDTH} wide",
        plan_lanes,
    ),
    Algorithm.DEPTHWISE_PLANES: Family(
        is_plane_depthwise,
        "one input channel per group (groups == C > 1), stride 1 and an output as wide as "
        "the input (horizontal padding adding up to (S-1)*dilation)",
        plan_planes,
    ),
    Algorithm.DEPTHWISE_ROWS: Family(
        is_row_depthwise,
        f"one input channel per group (groups == C > 1) and a horizontal stride of at most "
        f"{MAX_ROW_STRIDE}",
        plan_rows,
    ),
    Algorithm.WINOGRAD: Family(
        is_winograd,
        "one group, 3x3 filters, stride 1 and dilation 1",
        plan_winograd,
        lambda plan: not streams_filters_once(plan),
    ),
}
