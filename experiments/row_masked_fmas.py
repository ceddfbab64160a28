"""Do the row kernel's masked FMAs beat anding each loaded vector?

    python experiments/row_masked_fmas.py [--threads 2] [--rounds 41]

Every depthwise layer of EfficientNet-B0 and MobileNetV2 that the analysis
gives the row plan, run through the plan's loop nest twice in one process,
side by side (interleaved rounds): with the row kernel as shipped (on an
AVX-512 target each FMA of a masked column adds under its load mask, a mask
register) and with each whole-loaded vector anded with its mask instead
(``rows_module_for(plan, masked_fmas=False)``).  The outputs must match bit for
bit (finite data: a tap on the padding adds ``0 * w`` or nothing, the same
sum).  Prints each layer's best times and the median of the paired rounds'
ratios (``cso.measure.paired_ratios``), and the totals.  On a target
without mask registers both builds are the anded one: it says so and stops.
"""

from __future__ import annotations

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import numpy as np

from cso.measure import round_times
from cso.microkernels.vector_ir import target_has_mask_registers


def main():
    parser = harness.parser(__doc__, threads=2, rounds=41)
    args = parser.parse_args()
    if not target_has_mask_registers():
        raise SystemExit("this target has no AVX-512 mask registers: nothing to compare")
    threads = args.threads
    rng = np.random.default_rng(0)
    totals = {}
    labels = {"anded": "anded", "masked": "masked FMAs"}
    print(f"{threads} thread(s), float32; times of the loop nest alone")
    for layer, plan in harness.row_plan_layers(threads):
        programs = harness.row_variant_programs(
            layer, plan, rng, "masked", "anded", masked_fmas=False
        )
        samples = round_times(programs, args.rounds)
        harness.report_paired(layer, plan, samples, totals, "anded", "masked", labels)
    harness.report_paired_totals(totals, "anded", "masked", labels)


if __name__ == "__main__":
    main()
