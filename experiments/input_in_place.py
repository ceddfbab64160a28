"""1x1 stride-1 layers with their input packed (as planned) against read in place.

    python experiments/input_in_place.py [--model resnet50|vgg16] [--batch 8] [--threads 1]
                                         [--layers NAME ...] [--rounds R]

The analysis packs a 1x1, stride-1 layer's input into panels once its
channel planes reach half a page
(:func:`cso.analysis.tiles.reads_input_in_place`), and the micro-kernel
then reads contiguous panels; read in place, it would read each channel's
row straight from ``x`` a plane apart, saving the copy (17-25% of these
layers' time at batch 8, ``stage_times.py``).  For every such layer the
model packs, this times the model's plan against the same plan with
``input_in_place`` set (image by image: a folded plan is replaced by the
model's unfolded one, since a folded tile may span two images), side by
side, results checked against each other.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.analysis import tiles  # noqa: E402
from cso.measure import best_times  # noqa: E402
from cso.models import MODELS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forced_shapes import check_agree, describe, program_for  # noqa: E402


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", nargs="*", help="layer names (default: all that apply)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{args.model}, batch {args.batch}, {args.threads} thread(s), per call")
    print(f"{'layer':<26} {'plan':<42} {'packed ms':>10} {'in place':>9} {'packed/in place':>16}")
    rng = np.random.default_rng(0)
    totals = [0.0, 0.0]
    for layer in MODELS[args.model]():
        if args.layers and layer.name not in args.layers:
            continue
        x_shape = (args.batch,) + tuple(layer.x_shape[1:])
        params = dict(layer.params)
        plan = cso.plan_conv2d(
            x_shape, layer.w_shape, threads=args.threads, fold_batch=False, **params
        )
        g = plan.geometry
        # The analysis' own rule, without its half-page bound on the plane.
        could_read_in_place = tiles.reads_input_in_place(
            g.kernel_height,
            g.kernel_width,
            (g.stride_h, g.stride_w) != (1, 1),
            g.pad_top or g.pad_bottom or g.pad_left or g.pad_right,
            plane_bytes=0,
            page_bytes=0,
        )
        if not could_read_in_place or plan.input_in_place or plan.vector_operand != "windows":
            continue
        # Channel-run packing belongs to packed inputs: off with it.
        in_place = dataclasses.replace(plan, input_in_place=True, pack_channels_outer=False)
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        programs = {
            "packed": program_for(x, w, plan, args.threads, False, **params),
            "in place": program_for(x, w, in_place, args.threads, False, **params),
        }
        check_agree(layer, programs, "packed")
        best = best_times(programs, args.rounds)
        totals[0] += best["packed"] * layer.count
        totals[1] += best["in place"] * layer.count
        print(
            f"{layer.name:<26} {describe(plan):<42} {best['packed'] * 1e3:10.3f} "
            f"{best['in place'] * 1e3:9.3f} {best['packed'] / best['in place']:16.3f}",
            flush=True,
        )
    if totals[1]:
        print(f"total (each layer times its count): packed / in place {totals[0] / totals[1]:.3f}")


if __name__ == "__main__":
    main()
