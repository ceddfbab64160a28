"""The pieces every family's story in :mod:`.explain` shares: sizes in
words, where the cost weights came from, the compulsory traffic, and the
machine-and-problem header of the depthwise and grouped families."""

from __future__ import annotations

import numpy as np

from .choices import Algorithm


def size_text(count: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def weights_origin(weights) -> str:
    """Whether the cost weights were measured on this machine, in a sentence."""
    if weights.origin == "calibrated":
        return "cost weights: calibrated on this machine (python -m cso calibrate)"
    if weights.origin == "defaults":
        return (
            "cost weights: the defaults, measured on another machine (run "
            "`python -m cso calibrate` to measure this one's)"
        )
    return f"cost weights: {weights.origin}"


def compulsory_traffic(plan) -> str:
    """The bytes a call must move (its input, filters and output once)
    against its multiply-adds."""
    g = plan.geometry
    taps = g.channels_per_group * g.kernel_height * g.kernel_width
    moved = g.batch * g.channels * g.height * g.width + g.filters * taps
    moved = (moved + g.batch * g.filters * g.windows) * np.dtype(plan.dtype).itemsize
    return (
        f"  compulsory traffic: {size_text(moved)} (input, filters, output) for "
        f"{g.flops / 2 / 1e6:.2f} M multiply-adds, {g.flops / moved:.2f} FLOP per byte"
    )


def family_header(plan) -> list:
    """The machine and the problem, as a tap or lane plan's story starts."""
    g, hw = plan.geometry, plan.hardware
    x_shape = (g.batch, g.channels, g.height, g.width)
    w_shape = (g.filters, g.channels_per_group, g.kernel_height, g.kernel_width)
    padding = ((g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right))
    if plan.algorithm == Algorithm.GROUPED:
        kind = f"{g.channels_per_group} input and {g.filters_per_group} output channels a group"
    elif plan.algorithm == Algorithm.WINOGRAD:
        kind = "dense"
    else:
        kind = f"depthwise, channel multiplier {g.filters_per_group}"
    return [
        f"Hardware ({hw.source}): L1 {size_text(hw.l1_bytes)}, L2 {size_text(hw.l2_bytes)}, "
        f"L3 {size_text(hw.l3_bytes)}; {hw.vector_bytes * 8}-bit vectors; {hw.cores} core(s)",
        weights_origin(hw.weights),
        "",
        "Problem",
        f"  x {x_shape}, w {w_shape} -> y {g.output_shape}, {plan.dtype}; stride "
        f"{(g.stride_h, g.stride_w)}, padding {padding}, "
        f"dilation {(g.dilation_h, g.dilation_w)}, groups {g.groups} ({kind}); "
        f"{g.flops / 1e9:.4f} GFLOP",
        "",
    ]
