"""Depthwise layers: cso's depthwise plan against its dense path and torch, side by side.

    python experiments/depthwise_layers.py [--threads T] [--rounds R]

Nine depthwise shapes of MobileNetV2/V3 and EfficientNet-B0 (3x3 and 5x5,
strides 1 and 2, planes 112x112 to 7x7), batch 1, float32: GFLOP/s of
``cso.conv2d`` (the analysis' plan, which must be the depthwise one), of
that plan with the one-row tap kernel (one load per FMA) instead of its
block of rows, of the same layer forced through the dense outer-product
path, and of torch when installed; results checked against the float64
reference; totals and the ratios.
"""

from __future__ import annotations

import dataclasses

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import numpy as np

import cso
from cso.measure import best_times, torch_peer

LAYERS = [  # (C, H, W, R, stride)
    (32, 112, 112, 3, 1),
    (96, 112, 112, 3, 2),
    (144, 56, 56, 3, 1),
    (144, 56, 56, 3, 2),
    (240, 28, 28, 5, 1),
    (480, 14, 14, 3, 1),
    (672, 14, 14, 5, 2),
    (1152, 7, 7, 5, 1),
    (960, 7, 7, 3, 1),
]


def main():
    args = harness.parser(__doc__, threads=1, rounds=9).parse_args()
    threads = args.threads
    torch_run = torch_peer(threads)
    rng = np.random.default_rng(0)
    totals = {}
    for channels, height, width, size, stride in LAYERS:
        x = rng.standard_normal((1, channels, height, width), dtype=np.float32)
        w = rng.standard_normal((channels, 1, size, size), dtype=np.float32)
        params = dict(stride=stride, padding=size // 2, groups=channels)
        plan = cso.plan_conv2d(x.shape, w.shape, threads=threads, **params)
        dense = cso.plan_conv2d(x.shape, w.shape, threads=threads, algorithm="dense", **params)
        one_row = dataclasses.replace(plan, rows_per_call=1)
        programs = {
            "cso": lambda: cso.conv2d(x, w, threads=threads, **params),
            "one-row": lambda: cso.conv2d(x, w, plan=one_row, **params),
            "dense": lambda: cso.conv2d(x, w, plan=dense, **params),
        }
        if torch_run is not None:

            def run_torch():
                import torch

                with torch.no_grad():
                    return torch.nn.functional.conv2d(
                        torch.from_numpy(x), torch.from_numpy(w), stride=stride,
                        padding=size // 2, groups=channels,
                    )  # fmt: skip

            torch_run(x[:, :1], w[:1], 1, 0)  # sets torch's thread count
            programs["torch"] = run_torch
        y = cso.conv2d(x, w, threads=threads, **params)
        error = float(np.max(np.abs(y - cso.reference.conv2d(x, w, **params))))
        for program in programs.values():
            program()
        best = best_times(programs, args.rounds)
        flops = 2 * channels * y.shape[2] * y.shape[3] * size * size
        cells = " ".join(f"{name} {flops / s / 1e9:6.1f}" for name, s in best.items())
        print(
            f"{channels:>5} {height}x{width} {size}x{size}/{stride} {plan.algorithm:<9} "
            f"{plan.rows_per_call:>2}x{plan.windows_per_tile:<3} "
            f"GFLOP/s: {cells}  max error {error:.1e}"
        )
        for name, seconds in best.items():
            totals[name] = totals.get(name, 0.0) + seconds
    print(
        f"{threads} thread(s), totals: "
        + ", ".join(f"{n} {s * 1e3:.3f} ms" for n, s in totals.items())
    )
    for name in ("one-row", "dense", "torch"):
        if name in totals:
            print(f"cso is {totals[name] / totals['cso']:.2f}x {name}'s speed")


if __name__ == "__main__":
    main()
