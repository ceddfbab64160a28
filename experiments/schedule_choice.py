"""IS against WS on every layer of a bench model: the model's choice against the measured best.

Both forced plans are timed in interleaved rounds in one process, at
``--threads`` (one by default).  Measured on a Zen 3 (2026-11-26): at one
thread ResNet-50's model / best 1.013; at two the model took WS on all 23
layers and IS ran faster on 11-12 of them (model / best 1.029-1.040).
Usage: python experiments/schedule_choice.py [--model M] [--threads T]
"""


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)
import numpy as np

import cso
from cso.measure import best_times
from cso.models import MODELS


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    agree = 0
    totals = {"model": 0.0, "best": 0.0}
    layers = MODELS[args.model]()
    print(f"{'layer':<28} {'model':>5} {'IS GF/s':>8} {'WS GF/s':>8} {'best':>4}")
    for layer in layers:
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = dict(layer.params)
        plans = {
            s: cso.plan_conv2d(x.shape, w.shape, schedule=s, threads=args.threads, **params)
            for s in ("IS", "WS")
        }
        chosen = cso.plan_conv2d(x.shape, w.shape, threads=args.threads, **params).schedule
        programs = {
            s: (lambda p=p: cso.conv2d(x, w, plan=p, threads=args.threads, **params))
            for s, p in plans.items()
        }
        for program in programs.values():
            program()
        best = best_times(programs)
        winner = min(best, key=best.get)
        agree += winner == chosen
        totals["model"] += best[chosen] * layer.count
        totals["best"] += best[winner] * layer.count
        print(
            f"{layer.name:<28} {chosen:>5} {layer.flops / best['IS'] / 1e9:>8.1f} "
            f"{layer.flops / best['WS'] / 1e9:>8.1f} {winner:>4}"
        )
    print(
        f"model picked the faster schedule on {agree}/{len(layers)} layers; "
        f"model's total / best total = {totals['model'] / totals['best']:.3f}"
    )


if __name__ == "__main__":
    main()
