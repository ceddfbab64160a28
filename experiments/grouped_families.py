"""Grouped layers: the tap kernel (one filter a call and the model's F a call) against dense.

    python experiments/grouped_families.py [--threads T] [--rounds R] [--sample N] [--seed S]

For ResNeXt-50's grouped layers and ``N`` distinct grouped layers of 2 to
64 channels a group drawn (seeded) from ``../shared/data/convbench_public.csv``
(batch 1, float32): the grouped tap plan with the filters a call the model
picks (``grp``), the same plan with one filter a call (``grp.f1``, the
kernel before filters were batched), and the best dense plan (``dense``),
each timed through ``cso.conv2d`` in shuffled rounds and checked against
the float64 reference.  For each layer: the family the model finds cheaper
(grouped against dense, at any stride), the one the analysis takes (which
weighs grouped at stride 1 only unless told otherwise) and the fastest.
Totals by stride: the model's cheaper family against the fastest per layer.
"""

from __future__ import annotations

import csv
import dataclasses
import os

import harness
import numpy as np

import cso
from cso.geometry import make_geometry
from cso.measure import best_times

CONVBENCH = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "convbench_public.csv"
)


def convbench_grouped(count, seed) -> list:
    """``count`` distinct grouped ConvBench layers of 2-64 channels a group:
    ``(name, x_shape, w_shape, params)``."""
    if not os.path.exists(CONVBENCH):
        return []
    with open(CONVBENCH) as handle:
        rows = list(csv.DictReader(handle))
    found = []
    for row in rows:
        n = {k: int(row[k]) for k in ("C", "H", "W", "K", "R", "S", "groups", "stride_h")}
        if n["groups"] < 2 or not 2 <= n["C"] // n["groups"] <= 64:
            continue
        params = dict(
            stride=(int(row["stride_h"]), int(row["stride_w"])),
            padding=((int(row["pad_top"]), int(row["pad_bottom"])),
                     (int(row["pad_left"]), int(row["pad_right"]))),
            dilation=(int(row["dil_h"]), int(row["dil_w"])),
            groups=n["groups"],
        )  # fmt: skip
        x_shape = (1, n["C"], n["H"], n["W"])
        w_shape = (n["K"], n["C"] // n["groups"], n["R"], n["S"])
        make_geometry(x_shape, w_shape, **params)
        found.append(("convbench " + row["key"][:44], x_shape, w_shape, params))
    picks = np.random.default_rng(seed).permutation(len(found))[:count]
    return [found[i] for i in sorted(picks)]


def resnext_grouped() -> list:
    return [
        (layer.name, layer.x_shape, layer.w_shape, layer.params)
        for layer in harness.model_layers("resnext50")
        if layer.params.get("groups", 1) > 1
    ]


def cost(plan) -> float:
    return plan.cost_of(plan.schedule).cost


def main():
    parser = harness.parser(__doc__, threads=1, rounds=15)
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    totals = {}
    for name, x_shape, w_shape, params in resnext_grouped() + convbench_grouped(
        args.sample, args.seed
    ):
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        exact = cso.reference.conv2d(x, w, **params)
        plan = dict(threads=args.threads, **params)
        chosen = cso.plan_conv2d(x_shape, w_shape, **plan)
        plans = {
            "grp": cso.plan_conv2d(x_shape, w_shape, algorithm="grouped", **plan),
            "dense": cso.plan_conv2d(x_shape, w_shape, algorithm="dense", **plan),
        }
        if plans["grp"].filters_per_tile > 1:
            plans["grp.f1"] = dataclasses.replace(plans["grp"], filters_per_tile=1)
        programs = harness.checked_programs(name, plans, x, w, params, exact)
        best = best_times(programs, args.rounds)
        cheaper = "grp" if cost(plans["grp"]) < cost(plans["dense"]) else "dense"
        taken = "grp" if chosen.algorithm.value == "grouped" else "dense"
        fastest = min(("grp", "dense"), key=best.get)
        stride = max(chosen.geometry.stride_h, chosen.geometry.stride_w)
        total = totals.setdefault(stride, dict(layers=0, right=0, cheaper=0.0, taken=0.0,
                                               oracle=0.0, dense=0.0))  # fmt: skip
        total["layers"] += 1
        total["right"] += best[cheaper] <= 1.03 * best[fastest]
        total["cheaper"] += best[cheaper]
        total["taken"] += best[taken]
        total["oracle"] += best[fastest]
        total["dense"] += best["dense"]
        g = chosen.geometry
        cells = "  ".join(f"{key} {best[key] * 1e6:7.1f} us" for key in programs)
        print(
            f"{name:<46} Cg {g.channels_per_group:>2} m {g.filters_per_group:>3} s{stride} "
            f"F{plans['grp'].filters_per_tile} model: {cheaper:<5} (grp/dense "
            f"{cost(plans['grp']) / cost(plans['dense']):.2f}) fastest {fastest:<5} "
            f"(grp/dense {best['grp'] / best['dense']:.2f})  {cells}",
            flush=True,
        )
    for stride, t in sorted(totals.items()):
        print(
            f"stride {stride}, {t['layers']} layers: the model's cheaper family within 3% of the "
            f"fastest on {t['right']}; totals: cheaper {t['cheaper'] * 1e3:.3f} ms, as taken "
            f"{t['taken'] * 1e3:.3f}, fastest {t['oracle'] * 1e3:.3f}, all dense "
            f"{t['dense'] * 1e3:.3f} (cheaper / fastest {t['cheaper'] / t['oracle']:.3f})"
        )


if __name__ == "__main__":
    main()
