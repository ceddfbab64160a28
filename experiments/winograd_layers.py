"""Winograd F(2x2, 3x3) against the dense plan on every 3x3 stride-1 layer.

    python experiments/winograd_layers.py [--model resnet50] [--threads 1] [--rounds 15]
                                          [--layers NAME ...]

For each distinct 3x3 stride-1 layer of the model, the Winograd plan and
the dense plan (each forced; the analysis' tiles and kernel shape for that
family) are timed interleaved in one process through ``cso.conv2d``, each
result checked against the float64 reference first.  Prints both times, the
dense plan's time over Winograd's, each plan's modelled cost and the family
the analysis takes; then the totals over the layers (counted as often as
the model has them) of the analysis' choices, of dense everywhere and of
the faster per layer.  This is how to see where Winograd's 2.25x fewer
multiply-adds repay its transforms on the machine at hand, and whether the
model's choice follows.
"""

from __future__ import annotations

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times  # noqa: E402

FAMILIES = ("dense", "winograd")


def main() -> None:
    args = harness.parser(__doc__, model="resnet50", threads=1, rounds=15, layers=None).parse_args()
    layers = [
        layer
        for layer in harness.model_layers(args.model, args.layers)
        if layer.w_shape[2:] == (3, 3) and layer.stride == 1 and layer.groups == 1
    ]
    if not layers:
        raise SystemExit(f"{args.model} has no dense 3x3 stride-1 layer among those named")
    rng = np.random.default_rng(0)
    totals = {"analysis": 0.0, "dense": 0.0, "fastest": 0.0}
    print(f"{'layer':<28} {'n':>2} {'dense ms':>9} {'winograd ms':>12} {'dense/wg':>9} "
          f"{'cost dense':>11} {'cost wg':>9} analysis")  # fmt: skip
    for layer in layers:
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = layer.params
        plans = {
            family: cso.plan_conv2d(
                x.shape, w.shape, threads=args.threads, algorithm=family, **params
            )  # fmt: skip
            for family in FAMILIES
        }
        chosen = cso.plan_conv2d(x.shape, w.shape, threads=args.threads, **params).algorithm
        exact = cso.reference.conv2d(x.astype(np.float64), w.astype(np.float64), **params)
        programs = harness.checked_programs(layer.name, plans, x, w, params, exact)
        best = best_times(programs, args.rounds, 0.3)
        costs = {family: plan.cost_of(plan.schedule).cost for family, plan in plans.items()}
        print(
            f"{layer.name:<28} {layer.count:>2} {best['dense'] * 1e3:>9.3f} "
            f"{best['winograd'] * 1e3:>12.3f} {best['dense'] / best['winograd']:>9.2f} "
            f"{costs['dense']:>11.3g} {costs['winograd']:>9.3g} {chosen}",
            flush=True,
        )
        totals["analysis"] += layer.count * best[str(chosen)]
        totals["dense"] += layer.count * best["dense"]
        totals["fastest"] += layer.count * min(best.values())
    print(
        f"\n{args.model}, {args.threads} thread(s), {len(layers)} distinct 3x3 stride-1 layers: "
        f"analysis {totals['analysis'] * 1e3:.3f} ms, dense everywhere "
        f"{totals['dense'] * 1e3:.3f} ms ({totals['dense'] / totals['analysis']:.2f}x the "
        f"analysis'), fastest per layer {totals['fastest'] * 1e3:.3f} ms "
        f"(analysis / fastest {totals['analysis'] / totals['fastest']:.3f})"
    )


if __name__ == "__main__":
    main()
