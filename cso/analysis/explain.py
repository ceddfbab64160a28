"""A plan in words: the machine, the tiles, the caches, the costs, the loop nest.

One story a family: :mod:`.explain_dense` (outer product),
:mod:`.explain_taps` (depthwise and grouped taps), :mod:`.explain_lanes`,
:mod:`.explain_planes` (planes and rows), :mod:`.explain_winograd`;
:mod:`.explain_text` holds what
they share.
"""

from __future__ import annotations

from .choices import TAP_ALGORITHMS, Algorithm
from .explain_dense import dense_story, padding_share
from .explain_lanes import lane_story
from .explain_planes import plane_story, row_story, weighed_against
from .explain_taps import tap_story
from .explain_winograd import winograd_story
from .explain_text import compulsory_traffic, family_header, size_text
from .planner import plan_for_geometry


def _explain_lanes(plan) -> str:
    """A lane plan's story: the machine and problem, then :func:`~.explain_lanes.lane_story`."""
    story = lane_story(plan, weighed_against(plan), size_text, compulsory_traffic(plan))
    return "\n".join(family_header(plan) + story)


def _explain_depthwise(plan) -> str:
    """A tap plan's story (depthwise or grouped): the machine and problem, then
    :func:`~.explain_taps.tap_story`, weighed against the best dense plan."""
    g, hw = plan.geometry, plan.hardware
    dense = plan_for_geometry(
        g, plan.dtype, hw, None, None, None, plan.threads, algorithm=Algorithm.DENSE
    )
    story = tap_story(plan, dense, size_text, compulsory_traffic(plan), padding_share(plan))
    return "\n".join(family_header(plan) + story)


def explain(plan) -> str:
    """Everything the analysis decided for ``plan``, as text."""
    if plan.algorithm == Algorithm.DEPTHWISE_LANES:
        return _explain_lanes(plan)
    unpacked = {
        Algorithm.DEPTHWISE_PLANES: plane_story,
        Algorithm.DEPTHWISE_ROWS: row_story,
        Algorithm.WINOGRAD: winograd_story,
    }
    if plan.algorithm in unpacked:
        story = unpacked[plan.algorithm](plan, weighed_against(plan), compulsory_traffic(plan))
        return "\n".join(family_header(plan) + story)
    if plan.algorithm in TAP_ALGORITHMS:
        return _explain_depthwise(plan)
    return dense_story(plan)
