"""Where cso's time goes on chosen layers, at any batch and thread count.

    python experiments/stage_times.py [--model M] [--batch 8] [--threads 1]
                                      [--layers NAME ...] [--rounds 5]

``python -m cso bench --breakdown`` times the stages of every layer of a
run; this does the same for a few layers (by default ResNet-50's 56x56 and
28x28 layers where torch is ahead at batch 8), with the stages of
:func:`cso.measure.stage_times` (kernel, input packing, filters, the rest, by
difference of variants of the loop nest; a depthwise family's own stages,
such as the lane nest's output unpacking, and "-" for a stage a family
does not have).  It also prints each layer's rate
and the kernel stage's alone, as shares of the FMA peak
(:func:`cso.microkernels.peak.fma_peak_gflops`, per thread): how far the
micro-kernel runs below its L1-resident ceiling (``kernel_ceiling.py``) and
how much the stages around it add.
"""

from __future__ import annotations


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import kernel_name, stage_times  # noqa: E402
from cso.microkernels.peak import fma_peak_gflops  # noqa: E402
from cso.models import MODELS  # noqa: E402

DEFAULT_LAYERS = [
    "l1 1x1 64->64 @56",
    "l1 3x3 64 @56",
    "l1 1x1 256->64 @56",
    "l2 1x1 512->128 @28",
    "l4 3x3 512 @7",
]
# A family without a stage (the plane and row nests pack nothing) shows "-" there.
STAGES = ("kernel", "input packing", "output unpacking", "filters", "rest")


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", nargs="*", help="layer names (default: five ResNet-50 ones)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    names = args.layers or DEFAULT_LAYERS
    lanes = max(1, cso.detect_hardware().vector_bytes // 4)  # this machine's float32 vectors
    peak = fma_peak_gflops("float32", lanes) * args.threads
    print(
        f"{args.model}, batch {args.batch}, {args.threads} thread(s), float32; "
        f"FMA peak {peak:.1f} GFLOP/s; shares of each layer's time"
    )
    print(
        f"{'layer':<26} {'kernel':>8} {'ms':>8} "
        + " ".join(f"{s:>16}" for s in STAGES)
        + f" {'of peak':>8} {'kernel stage':>13}"
    )
    rng = np.random.default_rng(0)
    for layer in MODELS[args.model]():
        if layer.name not in names:
            continue
        x_shape = (args.batch,) + tuple(layer.x_shape[1:])
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = dict(layer.params)
        plan = cso.plan_conv2d(x_shape, w.shape, threads=args.threads, **params)
        stages = stage_times(plan, x, w, args.rounds)
        gflop = layer.flops * args.batch / 1e9
        total = stages["total"]
        print(
            f"{layer.name:<26} {kernel_name(plan):>8} {total * 1e3:8.3f} "
            + " ".join(
                f"{stages[s] / total:>16.0%}" if s in stages else f"{'-':>16}" for s in STAGES
            )
            + f" {gflop / total / peak:>8.0%} {gflop / stages['kernel'] / peak:>13.0%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
