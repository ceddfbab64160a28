"""Where the 3x3 layers' time goes, against the 90%-of-peak target (one thread).

    python experiments/limits_3x3.py [--rounds R]

For each 3x3 layer with C >= 64 of ResNet-50 and VGG-16, ``cso.conv2d`` per
call (windows in the vectors, filters read in place):

* ``total``: useful GFLOP/s of the whole call, as a share of the FMA peak
  (timed interleaved with ``packed``);
* ``padded``: share of the micro-kernels' multiply-adds spent on padding
  (window tiles past P*Q, filter tiles past K);
* ``packing``: share of the loop nest's time spent packing input panels (it
  less the same loop nest that never packs);
* ``kernel``: the micro-kernels' executed multiply-adds (padding included)
  per second of micro-kernel time (the call less the loop nest with a no-op
  kernel), as a share of the peak: the kernel *in the loop nest*, its
  operands streaming from L2 as the plan places them;
* ``packed``: the same layer with filters packed ahead, where the analysis
  may take the filter-vectorised 32x14 kernel.

Then the ceiling: each micro-kernel alone on one L1-resident tile (depth
256, operands 64-byte aligned), as a share of the peak.  The gap between
``kernel`` and that ceiling is the cost of streaming the panels from L2;
the rest of the gap to 100% is padding and packing.
"""

from __future__ import annotations

import sys

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.analysis.explain_dense import padding_share  # noqa: E402
from cso.measure import best_times, stage_times  # noqa: E402
from cso.calibrate.kernel_probes import call_flops, resident_seconds  # noqa: E402
from cso.microkernels.peak import fma_peak_gflops  # noqa: E402
from cso.models import resnet50, vgg16  # noqa: E402


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lanes = max(1, cso.detect_hardware().vector_bytes // 4)
    peak = fma_peak_gflops("float32", lanes)
    print(f"one thread, batch 1, float32; FMA peak {peak:.1f} GFLOP/s")
    layers = [
        (model, layer)
        for model, layers in (("resnet50", resnet50()), ("vgg16", vgg16()))
        for layer in layers
        if layer.w_shape[2:] == (3, 3) and layer.w_shape[1] >= 64
    ]
    print(
        f"{'model':<9} {'layer':<22} {'kernel':>7} {'total':>6} {'padded':>7} {'packing':>8} "
        f"{'kernel':>7} {'packed':>7} {'kernel':>7}"
    )
    rng = np.random.default_rng(0)
    shapes = set()
    for model, layer in layers:
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = dict(layer.params)
        plan = cso.plan_conv2d(x.shape, w.shape, threads=1, **params)
        stages = stage_times(plan, x, w, args.rounds)
        packed = cso.pack_filters(w, x.shape, threads=1, **params)
        programs = {
            "cso": lambda: cso.conv2d(x, w, threads=1, **params),
            "packed": lambda: cso.conv2d(x, packed, threads=1),
        }
        for program in programs.values():
            program()
        best = best_times(programs, args.rounds)
        flops = plan.geometry.flops
        padded = padding_share(plan)
        executed = flops / (1 - padded)
        kernel_share = executed / stages["kernel"] / 1e9 / peak
        for p in (plan, packed.plan):
            shapes.add((p.filters_per_tile, p.windows_per_tile, p.vector_operand))
        print(
            f"{model:<9} {layer.name:<22} {_name(plan):>7} "
            f"{flops / best['cso'] / 1e9 / peak:6.0%} {padded:7.1%} "
            f"{stages['input packing'] / stages['total']:8.0%} {kernel_share:7.0%} "
            f"{flops / best['packed'] / 1e9 / peak:7.0%} {_name(packed.plan):>7}",
            flush=True,
        )
    print("\nthe ceiling: each micro-kernel alone, one L1-resident tile, depth 256")
    # The calibration's own L1 probe, every shape timed in interleaved rounds.
    resident = resident_seconds(sorted(shapes), lanes)
    for nf, nwin, operand in sorted(shapes):
        rate = call_flops(nf, nwin, resident[(nf, nwin, operand)]) / 1e9
        print(f"  {nf}x{nwin} ({operand} in the vectors): {rate:6.1f} GFLOP/s, {rate / peak:.0%}")
    return 0


def _name(plan):
    return f"{plan.filters_per_tile}x{plan.windows_per_tile}{plan.vector_operand[0]}"


if __name__ == "__main__":
    sys.exit(main())
