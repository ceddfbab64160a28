"""The lane plan in words: the kernels, the transposes, the choice, the loop nest.

:func:`cso.analysis.explain.explain` heads it with the machine and the
problem, as for every plan.
"""

from __future__ import annotations

import numpy as np

from ..geometry import ceil_div
from . import lanes
from .choices import Algorithm


def lane_story(plan, others, size, compulsory) -> list:
    """The lines that tell ``plan``'s (a lane plan's) story.

    ``others`` are the plans it was weighed against (``(label, plan)``),
    ``size`` formats a byte count and ``compulsory`` is the line on the
    call's compulsory traffic, as every tap family's story gives it.
    """
    g, hw = plan.geometry, plan.hardware
    s = np.dtype(plan.dtype).itemsize
    vl, outputs = plan.vector_lanes, plan.windows_per_tile
    traffic = plan.cost_of(plan.schedule)
    taps = g.kernel_height * g.kernel_width
    band = lanes.band_rows(g, hw, s)
    loads = lanes.lane_kernel_loads(g, outputs)
    fmas = outputs * taps
    blocks = ceil_div(g.channels, vl)
    idle = blocks * vl - g.channels
    plane = lanes.packed_rows(g) * lanes.pitch(g) * vl
    lines = [
        "Algorithm: depthwise, channels in the vector lanes",
        f"  lane tap kernel: {outputs} pixel(s) of one output row x {vl} channels in "
        f"registers; {fmas} FMAs from {loads} vector loads a call ({fmas / loads:.2f} FMAs per "
        f"load: each input vector feeds every pixel that reads it, the {g.kernel_width} tap "
        "vectors of a filter row held)",
        f"  {blocks} block(s) of {vl} channels"
        + (f", the last with {vl - idle} (its other lanes are zeros)" if idle else "")
        + f"; {g.out_height} rows x {ceil_div(g.out_width, outputs)} call(s) a block"
        + (
            " (a row's last run starts early enough to end at its edge)"
            if g.out_width % outputs
            else ""
        ),
        f"  transposes of {vl} x {vl}: {lanes.transposes_per_job(g, vl, band)} a block (its "
        f"input planes to pixel vectors, its filters, its output back, {band} row(s) at a "
        "time while they are in L1, with the epilogue)",
        f"  packed plane: {lanes.packed_rows(g)} x {lanes.pitch(g)} pixels = "
        f"{size(plane * s)} per worker (every tap of every stride and dilation a whole-vector "
        "load, zeros for the padding)",
        compulsory,
        "",
        "Choice",
        f"  {Algorithm.DEPTHWISE_LANES}: modelled cost {traffic.cost:.3g} per (channel, image)"
        + "".join(f"; {label} {other.cost_of(other.schedule).cost:.3g}" for label, other in others),
        f"  per channel: {traffic.kernel_calls} kernel calls, {traffic.tap_loads} loads, "
        f"{traffic.packed_input_elements} elements transposed at "
        f"{hw.weights.lane_transpose_cost:g} units each; busiest thread "
        f"{traffic.imbalance:.3f}x an even share",
        "",
        "Loop nest",
        f"  for (image, block of {vl} channels) in {g.batch} x {blocks} jobs over "
        f"{plan.threads} thread(s)",
        "    transpose the block's filters and input planes to pixel vectors",
        f"    for band of {band} output row(s)",
        "      for p in the band",
        f"        for q0 in {ceil_div(g.out_width, outputs)} run(s) of {outputs} pixel(s)",
        f"          lane tap kernel: staged[p, q0:q0+{outputs}] = bias + sum of {taps} taps",
        "      transpose the band back to the output planes, epilogue applied",
    ]
    return lines
