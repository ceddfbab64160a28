"""Do the row kernel's unmasked inner vectors pay?

    python experiments/row_inner_vectors.py [--threads 2] [--rounds 21]

Every depthwise layer of MobileNetV2 and EfficientNet-B0 that the analysis
gives the row plan, and whose calls' inner vectors lie inside the row
(:func:`cso.analysis.rows.full_interior_vectors`), run through the plan's
loop nest twice in one process, side by side (interleaved rounds): with the
row kernel as shipped (vectors ``1 <= u <= U-2`` loaded and stored whole,
the columns unrolled) and with every vector masked, the columns in a loop
(``rows_module_for(plan, unmasked_inner=False)``).  Both calls have no
epilogue, so both take the kernel's epilogue-free columns.  The outputs
must match bit for bit (the same FMAs in the same order); prints each
layer's times and ratio, and the total over those layers.
"""

from __future__ import annotations

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import numpy as np

from cso.analysis.rows import full_interior_vectors
from cso.measure import best_times, kernel_name


def main():
    parser = harness.parser(__doc__, threads=2, rounds=21)
    args = parser.parse_args()
    threads = args.threads
    rng = np.random.default_rng(0)
    totals = {"whole": 0.0, "masked": 0.0}
    print(f"{threads} thread(s), float32; times of the loop nest alone")
    for layer, plan in harness.row_plan_layers(threads):
        g = plan.geometry
        vectors = plan.windows_per_tile // plan.vector_lanes
        if not full_interior_vectors(g, plan.vector_lanes, vectors):
            print(f"{layer.name:<22} {kernel_name(plan):>9}  no inner vectors to unmask")
            continue
        programs = harness.row_variant_programs(
            layer, plan, rng, "whole", "masked", unmasked_inner=False
        )
        best = best_times(programs, args.rounds)
        for name in totals:
            totals[name] += best[name] * layer.count
        print(
            f"{layer.name:<22} {kernel_name(plan):>9}  inner whole {best['whole'] * 1e6:7.1f} us"
            f"  all masked {best['masked'] * 1e6:7.1f} us"
            f"  masked / whole {best['masked'] / best['whole']:.3f}  x{layer.count}"
        )
    if totals["whole"]:
        print(
            f"total: inner whole {totals['whole'] * 1e6:.1f} us, all masked "
            f"{totals['masked'] * 1e6:.1f} us, masked / whole "
            f"{totals['masked'] / totals['whole']:.3f}"
        )


if __name__ == "__main__":
    main()
