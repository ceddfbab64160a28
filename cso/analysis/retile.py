"""Re-tiling a plan: some of its decisions replaced, its modelled costs recomputed.

The autotuner (:mod:`cso.tune`) and the calibration's loop probes try
tiles the planner did not pick; a plan made this way still describes
itself (its ``costs`` are those of its own tiles).
"""

from __future__ import annotations

import dataclasses

from .candidates import TileChoice, problem_of, traffic, ws_window_parts
from .choices import SCHEDULES, Schedule
from .plan import Plan


def with_tiles(
    plan: Plan, *, schedule=None, channel_tile=None, l2_tiles=None, l3_tiles=None
) -> Plan:
    """``plan`` with some decisions replaced (as the autotuner tries them).

    The schedule's ``Nc``, ``K2`` and ``K3`` change as given; the model's
    costs are recomputed for the new tiles, so ``plan.costs`` keeps describing
    the plan it belongs to.  Values are bounded like the rules'
    (``1 <= Nc <= C``, ``1 <= K2, K3``).
    """
    schedule = plan.schedule if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'IS' or 'WS', got {schedule!r}")
    schedule = Schedule(schedule)
    g = plan.geometry
    by_schedule = dict(plan.tiles_by_schedule)
    nc, k2, k3 = by_schedule[schedule]
    nc = max(1, min(int(channel_tile if channel_tile is not None else nc), g.channels_per_group))
    k2 = max(1, int(l2_tiles if l2_tiles is not None else k2))
    k3 = max(1, int(l3_tiles if l3_tiles is not None else k3))
    by_schedule[schedule] = (nc, k2, k3)
    problem = problem_of(plan)
    window_parts = 1
    if schedule == Schedule.WS:
        window_parts = ws_window_parts(problem, plan.filters_per_tile, plan.windows_per_tile, k3)
    costs = tuple(
        (
            name,
            traffic(
                problem,
                plan.filters_per_tile,
                plan.windows_per_tile,
                TileChoice(name, *by_schedule[name], window_parts if name == schedule else 1),
            ),
        )
        for name in SCHEDULES
    )
    return dataclasses.replace(
        plan,
        schedule=schedule,
        channel_tile=nc,
        l2_tiles=k2,
        l3_tiles=k3,
        window_parts=window_parts,
        costs=costs,
        tiles_by_schedule=tuple((name, by_schedule[name]) for name in SCHEDULES),
    )
