"""Per-call time saved by pre-packed filters on a model's layers (one thread).

For every layer: ``cso.conv2d(x, w)`` (filters read in place, edge tiles
packed per call) against ``cso.conv2d(x, packed)`` (panels packed once by
``cso.pack_filters``), timed side by side in interleaved rounds; and the
one-off cost of packing.  Usage: python experiments/prepack_savings.py
[--model resnet50|vgg16] [--threads 1]
"""


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)
import time

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
    totals = {"per call": 0.0, "prepacked": 0.0, "packing": 0.0}
    print(f"{'layer':<28} {'per call ms':>11} {'prepacked ms':>12} {'saved':>6} {'pack ms':>8}")
    for layer in MODELS[args.model]():
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = dict(layer.params)
        start = time.perf_counter()
        packed = cso.pack_filters(w, x.shape, threads=args.threads, **params)
        packing = time.perf_counter() - start
        programs = {
            "per call": lambda: cso.conv2d(x, w, threads=args.threads, **params),
            "prepacked": lambda: cso.conv2d(x, packed, threads=args.threads),
        }
        for program in programs.values():
            program()
        best = best_times(programs, rounds=7)
        for name, seconds in best.items():
            totals[name] += seconds * layer.count
        totals["packing"] += packing * layer.count
        print(
            f"{layer.name:<28} {best['per call'] * 1e3:>11.3f} {best['prepacked'] * 1e3:>12.3f} "
            f"{1 - best['prepacked'] / best['per call']:>6.1%} {packing * 1e3:>8.2f}"
        )
    print(
        f"\n{args.model}, {args.threads} thread(s): per call {totals['per call'] * 1e3:.2f} ms, "
        f"prepacked {totals['prepacked'] * 1e3:.2f} ms "
        f"({1 - totals['prepacked'] / totals['per call']:.1%} saved per inference); "
        f"packing all layers once: {totals['packing'] * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
