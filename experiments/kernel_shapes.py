"""Another micro-kernel shape against the analysis' choice, per call, on small-plane 1x1 layers.

    python experiments/kernel_shapes.py [--shape 24x16] [--count 100] [--seed 0]

The per-call losers of ``sampled_shapes.py`` are stride-1 1x1 convolutions
whose small planes (36-400 windows) the 32-window tiles pad.  A narrower
window tile pads less: 24 filters x 16 windows (one vector) reaches 94% of
the FMA peak alone in L1 against 96% for 14 x 32.  This script takes the
same seeded sample as ``sampled_shapes.py``, keeps its stride-1 1x1 shapes,
and times, interleaved in one process at one thread, the analysis' plan
against the plan forced to ``--shape`` with windows in the vectors (the rest
of the plan chosen by the model for that shape), both per call, and checks
the forced plan's result against the reference.  Prints the speedup of the
forced shape per layer, its median, and the modelled cost ratio (below 1:
the model would prefer the forced shape if it were offered).
"""

from __future__ import annotations

import pathlib
import sys

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sampled_shapes import DATA, load, shapes  # noqa: E402


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--shape", default="24x16", help="Nf x Nwin, windows in the vectors")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    nf, nwin = (int(v) for v in args.shape.lower().split("x"))
    rows = load(DATA, 0.02, 0.5, "none")
    rng = np.random.default_rng(args.seed)
    sample = [rows[i] for i in sorted(rng.choice(len(rows), min(args.count, len(rows)), False))]
    ratios, model = [], []
    for row in sample:
        x_shape, w_shape, params = shapes(row)
        if w_shape[2:] != (1, 1) or params["stride"] != (1, 1):
            continue
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        chosen = cso.plan_conv2d(x_shape, w_shape, threads=1, **params)
        forced = cso.plan_conv2d(
            x_shape,
            w_shape,
            threads=1,
            filters_per_tile=nf,
            windows_per_tile=nwin,
            vector_operand="windows",
            **params,
        )
        expected = cso.reference.conv2d(x, w, **params)
        bound = cso.reference.conv2d(np.abs(x), np.abs(w), **params) * (
            (np.prod(w_shape[1:]) + 3) * np.finfo(np.float32).eps / 2
        )
        if not np.all(
            np.abs(cso.conv2d(x, w, threads=1, plan=forced, **params) - expected) <= bound
        ):
            sys.exit(f"{row['key']}: the forced {args.shape} plan is wrong")
        best = best_times(
            {
                "chosen": lambda: cso.conv2d(x, w, threads=1, plan=chosen, **params),
                "forced": lambda: cso.conv2d(x, w, threads=1, plan=forced, **params),
            },
            args.rounds,
        )
        ratio = best["chosen"] / best["forced"]
        cost_ratio = forced.cost_of(forced.schedule).cost / chosen.cost_of(chosen.schedule).cost
        ratios.append(ratio)
        model.append(cost_ratio)
        name = f"{chosen.filters_per_tile}x{chosen.windows_per_tile}{chosen.vector_operand[0]}"
        print(
            f"{row['key'][:48]:<48} {x_shape[2]}x{x_shape[3]:<3} chosen {name:<7} "
            f"{args.shape} speed x{ratio:.3f}  modelled cost x{cost_ratio:.3f}",
            flush=True,
        )
    ratios = np.array(ratios)
    print(
        f"\n{len(ratios)} stride-1 1x1 shapes: {args.shape} per call against the analysis' plan: "
        f"median x{np.median(ratios):.3f}, faster on {int(np.sum(ratios > 1))}; "
        f"the model would have preferred it on {int(np.sum(np.array(model) < 1))}"
    )


if __name__ == "__main__":
    main()
