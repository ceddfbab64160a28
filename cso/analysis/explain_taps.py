"""The tap plans in words (depthwise and grouped): the tap kernel, the packed
channels, the choice against dense, the loop nest.

:func:`cso.analysis.explain.explain` heads it with the machine and the
problem, as for every plan.
"""

from __future__ import annotations

import numpy as np

from ..geometry import ceil_div
from . import depthwise, tap_layout, tap_rules
from .choices import Algorithm


def tap_story(plan, dense, size, compulsory, padding) -> list:
    """The lines that tell ``plan``'s (a tap plan's) story: the tap kernel,
    the packed channels, the memory moved against the multiply-adds, and
    why not ``dense`` (the best dense plan).

    ``size`` formats a byte count, ``compulsory`` is the line on the call's
    compulsory traffic and ``padding`` the share of the kernel's
    multiply-adds spent on padding, as :mod:`.explain` gives them.
    """
    g = plan.geometry
    s = np.dtype(plan.dtype).itemsize
    segment, lanes = plan.windows_per_tile, plan.vector_lanes
    grouped = plan.algorithm == Algorithm.GROUPED
    taps = g.channels_per_group * g.kernel_height * g.kernel_width
    traffic = plan.cost_of(plan.schedule)
    dense_cost = dense.cost_of(dense.schedule).cost
    rows = plan.rows_per_call
    filters = plan.filters_per_tile
    vectors = segment // lanes
    packed = tap_layout.packed_channel_elements(g, segment, lanes)
    loads = depthwise.kernel_loads(g, rows, segment, lanes, filters)
    fmas = filters * rows * vectors * taps
    lines = [
        "Algorithm: " + ("grouped" if grouped else "depthwise"),
        f"  tap kernel: {filters} filter(s) x {rows} output row(s) x {vectors} vector(s) of "
        f"{lanes} outputs ({rows} x {segment} a filter) in registers; {fmas} FMAs from "
        f"{loads} vector loads a call ({fmas / loads:.2f} FMAs per load"
        + (
            f": each load feeds every row of the block that reads it, the {g.kernel_height} "
            "weights of a column tap held as broadcasts)"
            + (
                f"; its columns run over the group's {g.channels_per_group} channels: "
                f"{taps} taps a filter, weights read in place from KCRS"
                if grouped
                else ""
            )
            if rows > 1
            else ": one row" + (", one load per FMA)" if filters == 1 else ")")
        ),
    ]
    if rows > 1 and filters == 1:
        registers = plan.hardware.vector_registers
        most = tap_rules.max_tap_rows(
            vectors, g.kernel_height, registers, filters, g.stride_h, g.dilation_h
        )
        live = tap_rules.tap_live_vectors(
            rows, vectors, g.kernel_height, filters, g.stride_h, g.dilation_h
        )
        lines.append(
            f"  blocks of {rows} rows: the {g.out_height} output rows split evenly into blocks "
            f"of at most {most}, the most whose column loop keeps its live vectors "
            f"(accumulators, weights, input rows feeding two FMAs or more; {live} here) in the "
            f"{registers} registers without spilling to the stack"
        )
    if filters > 1:
        broadcasts = loads - depthwise.kernel_loads(g, rows, segment, lanes)
        lines.append(
            f"  {filters} filters a call: each input vector loaded once feeds all of them "
            f"(one filter a call would load it {filters} times); their weights add "
            f"{broadcasts} broadcasts a call, counted as loads"
        )
    lines += [
        f"  {padding:.1%} of its multiply-adds are padding or computed twice ("
        + (
            f"rows narrower than a vector: all but the last "
            f"{depthwise.masked_rows(g, segment, rows)} row(s) store whole vectors that run on "
            "into the rows after them)"
            if depthwise.masked_rows(g, segment, rows)
            else "a row's last segment and a plane's last block start early enough to end at "
            "the edge: every store is whole)"
        ),
        f"  packed channel: {g.stride_w} phase(s) x {tap_layout.packed_rows(g)} rows x "
        f"{tap_layout.phase_width(g, segment, lanes)} = {size(packed * s)}, "
        f"{g.channels_per_group} per worker (every tap a contiguous load, zeros for the "
        "padding; each input element packed once, not once per tap as dense panels are)"
        + (
            f"; stride 1: a job writes {tap_layout.packed_channel_writes(g, segment, lanes)} "
            "elements a channel, the rows holding the input, and the padding is zeroed once "
            "a call"
            if g.stride_w == 1
            else ""
        ),
        compulsory,
        "",
        "Choice",
        f"  {plan.algorithm}: modelled cost {traffic.cost:.3g} per (group, image) against the best "
        f"dense plan's {dense_cost:.3g} ({dense.filters_per_tile}x{dense.windows_per_tile} "
        f"{dense.schedule}); {traffic.kernel_calls} kernel calls, {traffic.tap_loads} loads, "
        f"{traffic.packed_input_elements} elements packed per job; busiest thread "
        f"{traffic.imbalance:.3f}x an even share",
        "",
        "Loop nest",
        f"  for (image, group) in {g.batch} x {g.groups} jobs over {plan.threads} thread(s)",
        f"    pack the group's {g.channels_per_group} channel(s)' "
        + ("input rows" if g.stride_w == 1 else "phases"),
        f"    for k0 in its {g.filters_per_group} output channel(s), {filters} at a time",
    ]
    lines += [
        f"      for p0 in {ceil_div(g.out_height, rows)} block(s) of {rows} output row(s)"
        " (the last ending at the last row)",
        f"        for q0 in {ceil_div(g.out_width, segment)} segment(s) of {segment}"
        " (the last ending at the row's end)",
        f"          tap kernel: y[k0:k0+{filters}, p0:p0+{rows}, q0:q0+{segment}] = bias + sum "
        f"of {taps} taps",
    ]
    return lines
