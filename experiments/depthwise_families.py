"""Depthwise families: every family that runs each depthwise layer, timed side by side.

    python experiments/depthwise_families.py [--threads T] [--rounds R] [--csv F]

For each distinct depthwise layer of EfficientNet-B0 and MobileNetV2 (batch
1, float32): the tap, lane, plane and row plans where they run the layer
(``cso.plan_conv2d(..., algorithm=...)``), each timed through
``cso.conv2d`` with its plan, in shuffled rounds; each result checked
against the float64 reference; the model's cost of each, the family the
analysis takes and the one that ran fastest.  The totals say what the
analysis' choices cost against the fastest family per layer (the oracle).
"""

from __future__ import annotations

import csv

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import numpy as np

import cso
from cso.measure import best_times
from cso.models import MODELS

FAMILIES = ("depthwise", "depthwise_lanes", "depthwise_planes", "depthwise_rows")


def layers() -> dict:
    """The distinct depthwise layers of the two models, by name."""
    found = {}
    for model in ("efficientnet_b0", "mobilenetv2_100"):
        for layer in MODELS[model]():
            if layer.depthwise:
                found.setdefault(layer.name, layer)
    return found


def main():
    parser = harness.parser(__doc__, threads=1, rounds=15)
    parser.add_argument("--csv", help="write one row per (layer, family) here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows, chosen_total, oracle_total = [], 0.0, 0.0
    for name, layer in layers().items():
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        exact = cso.reference.conv2d(x, w, **layer.params)
        chosen = cso.plan_conv2d(x.shape, w.shape, threads=args.threads, **layer.params)
        plans = {}
        for family in FAMILIES:
            try:
                plans[family] = cso.plan_conv2d(
                    x.shape, w.shape, threads=args.threads, algorithm=family, **layer.params
                )
            except ValueError:
                continue  # the family does not run this layer
        programs = harness.checked_programs(name, plans, x, w, layer.params, exact)
        best = best_times(programs, args.rounds)
        fastest = min(best, key=best.get)
        chosen_total += best[chosen.algorithm.value] * layer.count
        oracle_total += best[fastest] * layer.count
        cells = "  ".join(
            f"{family[10:] or 'taps'} {best[family] * 1e6:7.1f} us "
            f"({plan.cost_of(plan.schedule).cost:.3g})"
            for family, plan in plans.items()
        )
        print(
            f"{name:<20} x{layer.count} takes {chosen.algorithm.value:<17} fastest {fastest:<17} "
            f"{cells}",
            flush=True,
        )
        for family, plan in plans.items():
            rows.append(dict(
                layer=name, count=layer.count, family=family, seconds=best[family],
                model_cost=plan.cost_of(plan.schedule).cost,
                chosen=family == chosen.algorithm.value, fastest=family == fastest,
            ))  # fmt: skip
    print(
        f"{args.threads} thread(s): the analysis' families take {chosen_total * 1e3:.3f} ms, "
        f"the fastest per layer {oracle_total * 1e3:.3f} ms "
        f"(analysis / oracle {chosen_total / oracle_total:.3f})"
    )
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
