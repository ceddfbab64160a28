"""The plane plan in words: the kernel, its masks, the choice, the loop nest.

:func:`cso.analysis.explain.explain` heads it with the machine and the
problem, as for every plan.
"""

from __future__ import annotations

from . import planes, tiles
from .choices import Algorithm
from .planner import plan_for_geometry


def weighed_against(plan) -> list:
    """``[(label, plan)]``: the other families' plans for ``plan``'s layer
    (tap, lane where it runs, dense), as the planner weighed them."""
    g, hw = plan.geometry, plan.hardware
    algorithms = [Algorithm.DEPTHWISE, Algorithm.DEPTHWISE_LANES, Algorithm.DENSE]
    if not tiles.is_lane_depthwise(g):
        algorithms.remove(Algorithm.DEPTHWISE_LANES)
    return [
        (f"{algorithm} plan", plan_for_geometry(
            g, plan.dtype, hw, None, None, None, plan.threads, algorithm=algorithm
        ))
        for algorithm in algorithms
    ]  # fmt: skip


def plane_story(plan, others, compulsory) -> list:
    """The lines that tell ``plan``'s (a plane plan's) story.

    ``others`` are the plans it was weighed against (``(label, plan)``) and
    ``compulsory`` is the line on the call's compulsory traffic, as every
    tap family's story gives it.
    """
    g = plan.geometry
    vl = plan.vector_lanes
    per_call = plan.windows_per_tile // vl
    traffic = plan.cost_of(plan.schedule)
    taps = g.kernel_height * g.kernel_width
    _, checked = planes.mask_table(g, vl)
    calls = planes.call_schedule(checked, per_call)
    checked_calls = sum(1 for _, is_checked in calls if is_checked)
    vectors = planes.output_vectors(g, vl)
    return [
        "Algorithm: depthwise on the planes as given (stride 1, output as wide as the input)",
        f"  plane tap kernel: {per_call} vector(s) of {vl} consecutive output pixels of one "
        f"plane in registers; each of the {taps} taps one shifted, masked load of the unpacked "
        "input times the broadcast weight (one load per FMA: the kernel runs at its loads' "
        "rate)",
        f"  {vectors} output vector(s) a plane in {len(calls)} call(s), {checked_calls} of them "
        "checked (a mask per tap where rows fall off the plane, masked stores); the others "
        "read one mask per tap column",
        "  nothing packed: no pass over the input or output besides the kernel's own",
        compulsory,
        "",
        "Choice",
        f"  {Algorithm.DEPTHWISE_PLANES}: modelled cost {traffic.cost:.3g} per (filter, image)"
        + "".join(f"; {label} {other.cost_of(other.schedule).cost:.3g}" for label, other in others),
        f"  per plane: {traffic.kernel_calls} kernel calls, {traffic.tap_loads} loads (mask "
        f"loads of checked calls included); busiest thread {traffic.imbalance:.3f}x an even "
        "share",
        "",
        "Loop nest",
        f"  for (image, filter) in {g.batch} x {g.filters} jobs over {plan.threads} thread(s)",
        f"    for (v0, checked) in the plane's {len(calls)} call(s)",
        f"      plane tap kernel: y[v0*{vl} : (v0+{per_call})*{vl}] = bias + sum of {taps} "
        "shifted, masked taps, epilogue applied",
    ]
