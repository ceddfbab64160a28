"""``python -m cso explain``: the plan for one convolution, on this or another machine."""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _ints(text: str, name: str, count=None) -> tuple:
    try:
        values = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be comma-separated integers, got {text!r}")
    if count is not None and len(values) != count:
        raise argparse.ArgumentTypeError(f"{name} must have {count} integers, got {text!r}")
    return values


def _pair_or_int(text: str, name: str):
    values = _ints(text, name)
    if len(values) == 1:
        return values[0]
    if len(values) == 2:
        return values
    if len(values) == 4:
        return (values[0], values[1]), (values[2], values[3])
    raise argparse.ArgumentTypeError(f"{name} takes 1, 2 (h,w) or 4 (t,b,l,r) integers")


def main(argv=None) -> int:
    from .analysis.detect import detect_hardware
    from .analysis.explain import explain
    from .analysis.hardware import parse_size
    from .analysis.choices import Algorithm
    from .analysis.planner import plan_conv2d

    parser = argparse.ArgumentParser(
        prog="python -m cso explain",
        description="Show what cso's analysis decides for one convolution, and why.",
    )
    parser.add_argument(
        "--input", required=True, type=lambda t: _ints(t, "--input", 4), help="N,C,H,W"
    )
    parser.add_argument(
        "--weight", required=True, type=lambda t: _ints(t, "--weight", 4), help="K,C/groups,R,S"
    )
    parser.add_argument("--stride", default="1", type=lambda t: _pair_or_int(t, "--stride"))
    parser.add_argument("--padding", default="0", help="an int, h,w, t,b,l,r, 'same' or 'valid'")
    parser.add_argument("--dilation", default="1", type=lambda t: _pair_or_int(t, "--dilation"))
    parser.add_argument("--groups", default=1, type=int)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--threads", default=None, type=int)
    parser.add_argument("--schedule", default=None, choices=["IS", "WS"])
    parser.add_argument(
        "--algorithm",
        default=None,
        choices=[member.value for member in Algorithm],
        help="force the algorithm family instead of the cost model's choice",
    )
    parser.add_argument(
        "--prepacked",
        action="store_true",
        help="plan for filters packed ahead of time (cso.pack_filters, cso-prepack)",
    )
    for flag, help_text in (
        ("--l1", "L1 data cache per core, e.g. 32K"),
        ("--l2", "L2 per core, e.g. 1M"),
        ("--l3", "L3, e.g. 32M"),
        ("--line", "cache line bytes"),
        ("--vector-bytes", "SIMD register bytes (64 AVX-512, 32 AVX2)"),
        ("--vector-registers", "SIMD registers"),
        ("--cores", "cores"),
    ):
        parser.add_argument(flag, default=None, help=help_text)
    args = parser.parse_args(argv)
    padding = args.padding if args.padding in ("same", "valid") else None
    try:
        if padding is None:
            padding = _pair_or_int(args.padding, "--padding")
        changes = {}
        for flag, field in (
            ("l1", "l1_bytes"),
            ("l2", "l2_bytes"),
            ("l3", "l3_bytes"),
            ("line", "line_bytes"),
            ("vector_bytes", "vector_bytes"),
            ("vector_registers", "vector_registers"),
            ("cores", "cores"),
        ):
            value = getattr(args, flag)
            if value is not None:
                changes[field] = parse_size(value, "--" + flag.replace("_", "-"))
        hardware = detect_hardware()
        if changes:
            hardware = hardware.with_changes(**changes, source=f"{hardware.source}+command line")
        plan = plan_conv2d(
            args.input,
            args.weight,
            stride=args.stride,
            padding=padding,
            dilation=args.dilation,
            groups=args.groups,
            dtype=np.dtype(args.dtype),
            hardware=hardware,
            threads=args.threads,
            schedule=args.schedule,
            filters_prepacked=args.prepacked,
            algorithm=args.algorithm,
        )
    except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
        print(f"python -m cso explain: error: {error}", file=sys.stderr)
        return 2
    print(explain(plan))
    return 0
