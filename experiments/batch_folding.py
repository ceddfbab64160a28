"""The batch folded into the windows against image by image, on the layers the model folds.

    python experiments/batch_folding.py [--batch 8] [--threads 1] [--model resnet50] [--rounds 9]

For each layer where the analysis folds the batch (``Plan.batch_folded``),
two plans of ``cso.conv2d`` are timed side by side in interleaved rounds
(best of each): the model's folded plan and its best plan image by image
(``fold_batch=False``), per call and with the filters packed ahead
(``cso.pack_filters``).  Both results are checked against each other.
Prints GFLOP/s, the ratio, the padding each plan's tiles carry, and the
model-weighted totals over the folded layers.
"""

from __future__ import annotations


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times  # noqa: E402
from cso.geometry import ceil_div  # noqa: E402
from cso.models import resnet50, vgg16  # noqa: E402

MODELS = {"resnet50": resnet50, "vgg16": vgg16}


def padded_share(plan) -> float:
    """Share of the micro-kernels' columns that are padding."""
    columns = ceil_div(plan.window_count, plan.windows_per_tile) * plan.windows_per_tile
    return 1 - plan.window_count / columns


def main(argv=None) -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    threads = args.threads
    totals = {"call": [0.0, 0.0], "packed": [0.0, 0.0]}
    print(f"{args.model}, batch {args.batch}, {threads} thread(s): folded against image by image")
    print(
        f"{'layer':26} {'way':7} {'plan folded':>22} {'plan by image':>22} "
        f"{'folded GF/s':>12} {'by image':>9} {'ratio':>6}"
    )
    for layer in MODELS[args.model]():
        layer = layer.with_batch(args.batch)
        params = dict(layer.params)
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        for way in ("call", "packed"):
            prepacked = way == "packed"
            model = cso.plan_conv2d(
                x.shape, w.shape, threads=threads, filters_prepacked=prepacked, **params
            )
            if not model.batch_folded:
                continue  # the model does not fold this layer
            plan_of = {
                True: model,
                False: cso.plan_conv2d(
                    x.shape,
                    w.shape,
                    threads=threads,
                    filters_prepacked=prepacked,
                    fold_batch=False,
                    **params,
                ),
            }
            programs = {}
            for folded, plan in plan_of.items():
                if prepacked:
                    packed = cso.pack_filters(w, x.shape, threads=threads, plan=plan, **params)
                    programs[folded] = lambda packed=packed: cso.conv2d(x, packed, threads=threads)
                else:
                    programs[folded] = lambda plan=plan: cso.conv2d(
                        x, w, plan=plan, threads=threads, **params
                    )
            results = {folded: program() for folded, program in programs.items()}
            scale = float(np.max(np.abs(results[False])))
            if not np.allclose(results[True], results[False], rtol=1e-4, atol=1e-5 * scale):
                raise AssertionError(f"{layer.name}: folded and image-by-image results differ")
            best = best_times(programs, rounds=args.rounds)
            totals[way][0] += layer.count * best[True]
            totals[way][1] += layer.count * best[False]
            described = {
                folded: f"{plan.filters_per_tile}x{plan.windows_per_tile}"
                f"{plan.vector_operand[0]} {plan.schedule} pad {padded_share(plan):.0%}"
                for folded, plan in plan_of.items()
            }
            print(
                f"{layer.name:26} {way:7} {described[True]:>22} {described[False]:>22} "
                f"{layer.flops / best[True] / 1e9:12.1f} {layer.flops / best[False] / 1e9:9.1f} "
                f"{best[False] / best[True]:6.3f}",
                flush=True,
            )
    for way, (folded, by_image) in totals.items():
        if folded:
            print(f"total over the folded layers, {way}: {by_image / folded:.3f}x from folding")


if __name__ == "__main__":
    main()
