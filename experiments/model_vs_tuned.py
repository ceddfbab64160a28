"""The analysis against the autotuner: how close is the model's plan to the best found?

Over ResNet-50's and VGG-16's layers and a seeded sample of ConvBench shapes
(``../shared/data/convbench_public.csv``, when present): tune each layer
within a budget, then time the analysis' plan and the tuned best side by side
in interleaved rounds (so that the comparison is not biased by the tuner's
own minimum over noisy timings).  Also: for each layer, the best measured
time of each schedule against the model's predicted order.

With ``--confirm``, every layer whose analysis plan differs from the tuned
best is timed again after all layers are done, analysis and tuned side by
side with more rounds: on a shared two-core machine a layer's first timing
at two threads can meet the other tenant.  All of them, not only those that
came out behind: timing only those again would let noise turn misses into
hits and never hits into misses.  The layers that cross the 5% line either
way are printed, and the share within 5% after the second timing.

Each comparison is reported two ways: the ratio of the two plans' best
rounds, and the median over the rounds of the ratio of the two timed in
each (:func:`cso.measure.paired_ratios`), which a machine whose speed
drifts from one second to the next moves less.

Writes a CSV of everything and a PNG of predicted cost against measured
time (needs matplotlib: pip install ".[plot]").

Usage: python experiments/model_vs_tuned.py [--sample 50] [--budget 2]
       [--threads 1] [--confirm] [--out experiments/results]
"""


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)
import csv
import os
import pathlib
import sys

import numpy as np

if os.environ.get("OPENBLAS_NUM_THREADS") is None:
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

import cso  # noqa: E402
from cso.measure import paired_ratios, round_times  # noqa: E402
from cso.models import MODELS  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from forced_shapes import describe  # noqa: E402
from sampled_shapes import DATA, load, shapes  # noqa: E402


def convbench_layers(count, seed, min_gflop=0.01, max_gflop=0.3):
    if not DATA.exists() or count <= 0:
        return []
    rows = load(DATA, min_gflop, max_gflop, "none")
    rng = np.random.default_rng(seed)
    return [
        ("convbench " + rows[index]["key"][:40], *shapes(rows[index]))
        for index in sorted(rng.choice(len(rows), min(count, len(rows)), replace=False))
    ]


def model_layers(name):
    return [
        (
            f"{name} {layer.name}",
            layer.x_shape,
            layer.w_shape,
            dict(layer.params),
        )
        for layer in MODELS[name]()
    ]


def time_ratio(samples) -> float:
    """The analysis' plan's time over the tuned best's, at least 1: the
    median over the rounds of the two timed in each
    (:func:`cso.measure.paired_ratios`)."""
    return max(1.0, 1.0 / paired_ratios(samples, "tuned")["analysis"])


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--sample", type=int, default=50)
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--confirm", action="store_true",
                        help="time every layer whose plans differ again at the end")
    parser.add_argument("--out", default="experiments/results")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    layers = (
        model_layers("resnet50") + model_layers("vgg16") + convbench_layers(args.sample, args.seed)
    )
    rng = np.random.default_rng(args.seed)
    rows = []
    retimed = []  # (row, layer params, plans) of the layers to time again
    for index, (name, x_shape, w_shape, params) in enumerate(layers, 1):
        result = cso.tune(x_shape, w_shape, threads=args.threads, budget_s=args.budget, **params)
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        plans = {"analysis": result.analysis, "tuned": result.best}
        samples = round_times(
            {
                k: (lambda p=p: cso.conv2d(x, w, plan=p, threads=args.threads, **params))
                for k, p in plans.items()
            },
            rounds=7,
        )
        best = {k: min(times) for k, times in samples.items()}
        paired = time_ratio(samples)
        timed = [c for c in result.candidates if c.seconds is not None]
        schedule_best = {
            s: min((c.seconds for c in timed if c.plan.schedule == s), default=float("nan"))
            for s in ("IS", "WS")
        }
        costs = dict(result.analysis.costs)
        row = {
            "layer": name,
            "gflop": result.analysis.geometry.flops / 1e9,
            "analysis_plan": f"{result.analysis.algorithm} {describe(result.analysis)}",
            "tuned_plan": next(c.describe() for c in result.candidates if c.plan == result.best),
            "analysis_ms": best["analysis"] * 1e3,
            "tuned_ms": best["tuned"] * 1e3,
            "ratio": best["analysis"] / min(best["tuned"], best["analysis"]),
            "paired_ratio": paired,
            "predicted_cost": costs[result.analysis.schedule].cost,
            "cost_is": costs["IS"].cost,
            "cost_ws": costs["WS"].cost,
            "measured_is_ms": schedule_best["IS"] * 1e3,
            "measured_ws_ms": schedule_best["WS"] * 1e3,
            "candidates_timed": len(timed),
            "candidates": len(result.candidates),
            "tuned_is_analysis": result.best == result.analysis,
        }
        rows.append(row)
        if not row["tuned_is_analysis"]:
            retimed.append((row, x_shape, w_shape, params, plans))
        print(
            f"[{index}/{len(layers)}] {name[:44]:<44} analysis {row['analysis_ms']:8.3f} ms "
            f"tuned {row['tuned_ms']:8.3f} ms  x{row['ratio']:.3f} (paired x{paired:.3f})  "
            f"({row['candidates_timed']}/{row['candidates']} timed)",
            flush=True,
        )
    for row in rows:
        # Unless timed again: the first figure, or 1 where the tuner's best is
        # the analysis' own plan (two timings of one plan differ by noise alone).
        row["confirmed_ratio"] = 1.0 if row["tuned_is_analysis"] else row["ratio"]
        row["confirmed_paired_ratio"] = 1.0 if row["tuned_is_analysis"] else row["paired_ratio"]
    if args.confirm and retimed:
        print(f"\ntiming again the {len(retimed)} layers whose plans differ "
              "(those crossing the 5% line either way shown)")
        for row, x_shape, w_shape, params, plans in retimed:
            x = rng.standard_normal(x_shape, dtype=np.float32)
            w = rng.standard_normal(w_shape, dtype=np.float32)
            samples = round_times(
                {
                    k: (lambda p=p: cso.conv2d(x, w, plan=p, threads=args.threads, **params))
                    for k, p in plans.items()
                },
                rounds=15,
                min_seconds=0.5,
            )
            best = {k: min(times) for k, times in samples.items()}
            row["confirmed_ratio"] = best["analysis"] / min(best["tuned"], best["analysis"])
            row["confirmed_paired_ratio"] = time_ratio(samples)
            if (row["ratio"] > 1.05) != (row["confirmed_ratio"] > 1.05):
                first, again = row["ratio"], row["confirmed_ratio"]
                print(f"  {row['layer'][:44]:<44} x{first:.3f} -> x{again:.3f}")
    with open(out / "model_vs_tuned.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    ratios = np.array([r["ratio"] for r in rows])
    decided = [
        r
        for r in rows
        if np.isfinite(r["measured_is_ms"])
        and np.isfinite(r["measured_ws_ms"])
        and abs(r["measured_is_ms"] / r["measured_ws_ms"] - 1) > 0.05
    ]
    agree = sum(
        (r["cost_is"] < r["cost_ws"]) == (r["measured_is_ms"] < r["measured_ws_ms"])
        for r in decided
    )
    print(f"\n{len(rows)} layers, {args.threads} thread(s), tuning budget {args.budget} s each")
    print(
        f"analysis plan within 5% of the tuned best: {np.mean(ratios <= 1.05):.0%} of layers; "
        f"median ratio {np.median(ratios):.3f}, worst {ratios.max():.3f}"
    )
    paired_time_ratios = np.array([r["paired_ratio"] for r in rows])
    print(
        f"by paired rounds' medians: {np.mean(paired_time_ratios <= 1.05):.0%} within 5%; "
        f"worst {paired_time_ratios.max():.3f}"
    )
    if args.confirm:
        confirmed = np.array([r["confirmed_ratio"] for r in rows])
        confirmed_paired = np.array([r["confirmed_paired_ratio"] for r in rows])
        print(
            f"timed again: {np.mean(confirmed <= 1.05):.0%} within 5%; "
            f"worst {confirmed.max():.3f}; by paired rounds' medians "
            f"{np.mean(confirmed_paired <= 1.05):.0%} within 5%, worst {confirmed_paired.max():.3f}"
        )
    print(
        f"IS/WS order predicted right on {agree}/{len(decided)} layers where the measured "
        f"schedules differ by more than 5%"
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install '.[plot]')", file=sys.stderr)
        return
    figure, axis = plt.subplots(figsize=(7, 5))
    groups = {"resnet50": "tab:blue", "vgg16": "tab:orange", "convbench": "tab:green"}
    for group, colour in groups.items():
        chosen = [r for r in rows if r["layer"].startswith(group)]
        axis.scatter(
            [r["predicted_cost"] for r in chosen],
            [r["analysis_ms"] for r in chosen],
            s=14,
            color=colour,
            label=group,
        )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("predicted cost of the analysis' plan (model units, per group and image)")
    axis.set_ylabel("measured time of that plan (ms)")
    axis.set_title(f"cso cost model against measurement ({args.threads} thread)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "model_vs_tuned.png", dpi=120)
    print(f"wrote {out / 'model_vs_tuned.csv'} and {out / 'model_vs_tuned.png'}")


if __name__ == "__main__":
    main()
