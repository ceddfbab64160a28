"""The plane and row plans in words (the families that pack nothing): the
kernel, its masks, the choice, the loop nest.

:func:`cso.analysis.explain.explain` heads it with the machine and the
problem, as for every plan.
"""

from __future__ import annotations

from ..geometry import ceil_div
from . import planes, rows
from .choices import Algorithm
from .families import FAMILIES
from .planner import plan_for_geometry


def weighed_against(plan) -> list:
    """``[(label, plan)]``: the other families' plans for ``plan``'s layer
    (each of :data:`~.families.FAMILIES` that runs it, then dense), as the
    planner weighed them."""
    g, hw = plan.geometry, plan.hardware
    algorithms = [
        name for name, family in FAMILIES.items() if name != plan.algorithm and family.runs(g)
    ] + [Algorithm.DENSE]
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
    if planes.whole_plane_call(g, vl, plan.hardware.vector_registers):
        return _whole_plane_story(plan, others, compulsory)
    return [
        "Algorithm: depthwise on the planes as given (stride 1, output as wide as the input)",
        f"  plane tap kernel: {per_call} vector(s) of {vl} consecutive output pixels of one "
        f"plane in registers; each of the {taps} taps one shifted load of the unpacked "
        "input times the broadcast weight (one load per FMA: the kernel runs at its loads' "
        "rate)",
        f"  {vectors} output vector(s) a plane in {len(calls)} call(s), {checked_calls} of them "
        "checked (a mask per tap where rows fall off the plane, a lane vector each; "
        "masked loads and stores only at the very start and end of the input); the others "
        "load whole and zero what the columns cut by an and with one "
        "mask vector per tap column (it repeats every "
        f"{planes.column_period(g, vl)} vector(s))",
        "  nothing packed: no pass over the input or output besides the kernel's own",
        compulsory,
        "",
        "Choice",
        _costs_line(traffic, others),
        f"  per plane: {traffic.kernel_calls} kernel calls, {traffic.tap_loads} loads (masks "
        f"included); busiest thread {traffic.imbalance:.3f}x an even "
        "share",
        "",
        "Loop nest",
        f"  for (image, filter) in {g.batch} x {g.filters} jobs over {plan.threads} thread(s)",
        f"    for (v0, checked, columns) in the plane's {len(calls)} call(s)",
        f"      plane tap kernel: y[v0*{vl} : (v0+{per_call})*{vl}] = bias + sum of {taps} "
        "shifted, masked taps, epilogue applied",
    ]


def _costs_line(traffic, others) -> str:
    """The plane plan's modelled cost beside those it was weighed against."""
    return (
        f"  {Algorithm.DEPTHWISE_PLANES}: modelled cost {traffic.cost:.3g} per (filter, image)"
        + "".join(f"; {label} {other.cost_of(other.schedule).cost:.3g}" for label, other in others)
    )


def _whole_plane_story(plan, others, compulsory) -> list:
    """:func:`plane_story` where one call computes a whole plane."""
    g = plan.geometry
    vl = plan.vector_lanes
    traffic = plan.cost_of(plan.schedule)
    taps = g.kernel_height * g.kernel_width
    coverage = planes.tap_coverage(g, vl)
    vectors = len(coverage)
    used = sum(1 for row in coverage for covered in row if covered)
    masked = planes.whole_plane_loads(g, vl) - used
    return [
        "Algorithm: depthwise on the planes as given (stride 1, output as wide as the input)",
        f"  whole-plane tap kernel, built for {g.height}x{g.width} planes: all {vectors} "
        f"output vector(s) of {vl} pixels of a plane in one call; "
        f"{planes.grid_vectors(g, vl)} whole vectors loaded from the plane, each tap's "
        "vector one shuffle of two of them, times the broadcast weight",
        f"  {used} of {vectors * taps} (vector, tap) pairs on the plane; {masked} loaded "
        "vector(s) anded once for each column shift with a constant mask (what lies off "
        "the plane, or a tap reaches only by wrapping round a row), no tap masked; each "
        "output vector's taps one chain of FMAs, stored as it ends (a fused epilogue applied "
        "to a few vectors at a time); masked loads and stores only at the very start "
        "and end of the input",
        "  nothing packed: no pass over the input or output besides the kernel's own",
        compulsory,
        "",
        "Choice",
        _costs_line(traffic, others),
        f"  per plane: {traffic.kernel_calls} kernel call, {traffic.tap_loads} tap vectors "
        f"and masked loaded vectors; busiest thread {traffic.imbalance:.3f}x an even share",
        "",
        "Loop nest",
        f"  for (image, filter) in {g.batch} x {g.filters} jobs over {plan.threads} thread(s)",
        f"    whole-plane tap kernel: y[0 : {g.out_height * g.out_width}] = bias + sum of "
        f"{taps} shifted taps",
    ]


def row_story(plan, others, compulsory) -> list:
    """The lines that tell ``plan``'s (a row plan's) story; ``others`` and
    ``compulsory`` as for :func:`plane_story`."""
    g = plan.geometry
    vl = plan.vector_lanes
    per_call = plan.windows_per_tile // vl
    traffic = plan.cost_of(plan.schedule)
    taps = g.kernel_height * g.kernel_width
    groups = rows.load_groups(g.kernel_width, g.dilation_w, g.stride_w)
    starts = rows.row_calls(g.out_width, per_call * vl)
    picked = (
        f"one of every {g.stride_w} elements picked by one shuffle"
        if g.stride_w > 1
        else "the loaded vector itself"
    )
    block = plan.rows_per_call
    window = rows.block_window_rows(g, block)
    blocks = rows.block_starts(g.out_height, block)
    side = plan.filters_per_tile
    on_plane = rows.on_plane_taps(g, block)
    read = sum(count for count, _ in on_plane)
    side_by_side = (
        [
            f"  {side} filters side by side in each vector (filter k0 + f in lanes "
            f"[{g.out_width}f, {g.out_width}(f+1))): each loaded vector merged from {side} "
            "masked loads, one a filter's plane, each weight broadcast into its filter's "
            "lanes; one call computes them all"
        ]
        if side > 1
        else []
    )
    jobs = ceil_div(g.filters, side)
    kernel = [
        "Algorithm: depthwise on the planes as given, a block of output rows at a time",
        f"  row tap kernel: {block} output row(s) x {per_call} vector(s) of {vl} consecutive "
        f"outputs, one vector column at a time; each of the block's {window} input rows is "
        f"loaded once for every output row it serves ({rows.served_rows(g, block)} rows of "
        f"loads for {block * g.kernel_height} rows of taps); per row, {len(groups)} group(s) "
        f"of {g.stride_w} masked, unaligned load(s) serve the {g.kernel_width} column taps "
        f"({picked}), each times the broadcast weight, its lanes off the row left out (under "
        "the FMA's mask register where Numba compiles for AVX-512, else zeroed by an and); "
        f"window rows off the plane skipped ({read} of {len(blocks) * rows.served_rows(g, block)} "
        "read a plane)",
    ]
    return kernel + side_by_side + [
        f"  {len(blocks)} block(s) of {block} row(s) a plane"
        + (" (the last overlapping the one before)" if g.out_height % block else ""),
        f"  {len(starts)} call(s) a row at q0 = {starts}"
        + (
            " (the last overlapping the one before)"
            if len(starts) > 1 and g.out_width % (per_call * vl)
            else ""
        )
        + (
            f" ({side * g.out_width} of {per_call * vl} lanes used)"
            if side * g.out_width < per_call * vl
            else ""
        ),
        "  nothing packed: no pass over the input or output besides the kernel's own",
        compulsory,
        "",
        "Choice",
        f"  {Algorithm.DEPTHWISE_ROWS}: modelled cost {traffic.cost:.3g} per (filter, image)"
        + (f" ({side} filters side by side)" if side > 1 else "")
        + "".join(f"; {label} {other.cost_of(other.schedule).cost:.3g}" for label, other in others),
        f"  per plane: {traffic.kernel_calls} kernel calls, {traffic.tap_loads} loads and "
        f"shuffles; busiest thread {traffic.imbalance:.3f}x an even share",
        "",
        "Loop nest",
        (
            f"  for (image, filter) in {g.batch} x {g.filters} jobs over {plan.threads} thread(s)"
            if side == 1
            else f"  for (image, filters k0 .. k0+{side - 1}) in {g.batch} x {jobs} jobs over "
            f"{plan.threads} thread(s)"
        ),
        f"    for p in the {len(blocks)} block(s)' first rows (every {block})",
        f"      for q0 in the row's {len(starts)} call(s)",
        f"        row tap kernel: y[p : p+{block}, q0 : q0+{per_call * vl}] = bias + sum of "
        f"{taps} taps, epilogue applied",
    ]
