"""The loop nest as shipped against a variant of it: each layer, both ways.

    python experiments/variants.py [--variant no-prefetch|outlined|tile-by-tile|element-stores|
                                             array-operands] [--model M] [--threads T] [--rounds R]

For every distinct layer of the model, the same plan and the same operands
are run through two builds of its loop nest, timed interleaved in one
process (best of the rounds): as shipped, and the variant
(:data:`cso.measure.VARIANTS`, patches of :func:`cso.macrokernel.specialise.loop_module`):

* ``no-prefetch``: the micro-kernel without its software prefetch of its
  contiguous operand rows 16 reduction steps ahead;
* ``outlined``: the per-tile helper ``_tile`` and the packing step
  (``cso.macrokernel.input_tiles.pack_window_tiles``) called as functions
  instead of inlined into the loops;
* ``tile-by-tile``: the panels of 1x1, stride-1 layers packed one window
  tile at a time (``Nwin`` elements of every channel), as other layers are,
  instead of channel by channel over the whole block of tiles;
* ``element-stores``: a filter-vectorised micro-kernel writes its tile back
  one element at a time instead of transposing it in registers (layers
  with windows in the vectors run the same code both ways);
* ``array-operands``: the micro-kernel's filters, inputs and output handed
  to it as arrays, picked per tile, instead of as their data addresses
  (Numba then updates the picked arrays' reference counts on every tile).

Both per call (KCRS filters read in place) and with filters packed ahead
(``cso.pack_filters``, where the analysis may take the filter-vectorised
kernel).  The results must be identical bit for bit: neither variant
changes any arithmetic.  Prints each layer's speedup of the shipped build
over the variant (time with the variant / time as shipped) and the model
totals (the dense layers' only: depthwise plans run their own nest).
"""

from __future__ import annotations


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times, plan_program  # noqa: E402
from cso.models import MODELS  # noqa: E402


def _programs(x, w, kwargs, threads, packed_ahead, variant):
    """``(plan, {variant: program})`` for one layer, per call or packed ahead."""
    if packed_ahead:
        packed = cso.pack_filters(w, x.shape, threads=threads, **kwargs)
        plan = packed.plan
        if plan.vector_operand == "reduction" and variant == "no-prefetch":
            return plan, None  # dot-product kernels do not prefetch
    else:
        packed = None
        plan = cso.plan_conv2d(x.shape, w.shape, threads=threads, **kwargs)
        if plan.vector_operand == "reduction" and variant == "no-prefetch":
            return plan, None
    if plan.algorithm != "dense":
        return plan, None  # the variants patch the dense loop nests only
    return plan, {
        "on": plan_program(plan, x, w, prepacked=packed),
        "off": plan_program(plan, x, w, variant=variant, prepacked=packed),
    }


def main():
    parser = harness.parser(__doc__)
    parser.add_argument(
        "--variant",
        default="no-prefetch",
        choices=("no-prefetch", "outlined", "tile-by-tile", "element-stores", "array-operands"),
    )
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    totals = {(mode, v): 0.0 for mode in ("per call", "packed") for v in ("on", "off")}
    print(f"{'layer':<28} {'per call':>16} {'packed':>16}   (time {args.variant} / as shipped)")
    for layer in MODELS[args.model]():
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        kwargs = dict(layer.params)
        cells = []
        for mode in ("per call", "packed"):
            plan, programs = _programs(x, w, kwargs, args.threads, mode == "packed", args.variant)
            if programs is None:
                shown = "(dot product)" if plan.algorithm == "dense" else f"({plan.algorithm})"
                cells.append(f"{shown:>16}")
                continue
            results = {name: program().copy() for name, program in programs.items()}
            if not np.array_equal(results["on"], results["off"]):
                raise AssertionError(f"{layer.name}: {args.variant} changed the result")
            best = best_times(programs, args.rounds, 0.2)
            for variant, seconds in best.items():
                totals[(mode, variant)] += seconds * layer.count
            kernel = f"{plan.filters_per_tile}x{plan.windows_per_tile}{plan.vector_operand[0]}"
            cells.append(f"{kernel:>8} {best['off'] / best['on']:>7.3f}")
        print(f"{layer.name:<28} {cells[0]} {cells[1]}", flush=True)
    for mode in ("per call", "packed"):
        on, off = totals[(mode, "on")] * 1e3, totals[(mode, "off")] * 1e3
        print(
            f"total {mode:<9} {off:8.2f} ms {args.variant}, {on:8.2f} ms as shipped: "
            f"{off / on:.3f}x ({args.model}, batch 1, {args.threads} thread(s))"
        )


if __name__ == "__main__":
    main()
