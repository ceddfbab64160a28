"""Do the row and lane nests gain from their plane's geometry as constants?

    python experiments/row_plane_constants.py [--threads 2] [--rounds 41] [--peers]

Every depthwise layer of EfficientNet-B0 and MobileNetV2 that the analysis
gives the row or the lane plan, run through the plan's loop nest twice in
one process, side by side (interleaved rounds): as shipped, its module
built for the plane's geometry (height, width, padding, strides and what
follows from them are constants LLVM folds into each block), and through a
module that reads them from the nest's bounds, as every plane's module did
before (``rows_module_for(plan, fixed_plane=False)``,
``lanes_module_for(plan, fixed_plane=False)``).  The outputs must match bit
for bit.  ``--peers`` puts im2col + NumPy matmul and torch (when installed)
in the rounds, as ``python -m cso bench`` times them, so that each nest
meets the caches they leave.  Prints each layer's best times and the median
of the paired rounds' ratios (``cso.measure.paired_ratios``), and the totals
over the models' calls.
"""

from __future__ import annotations

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import numpy as np

from cso.analysis.choices import Algorithm
from cso.launch import lanes_module_for, rows_module_for
from cso.measure import im2col_gemm, round_times, torch_peer

MODULES = {Algorithm.DEPTHWISE_ROWS: rows_module_for, Algorithm.DEPTHWISE_LANES: lanes_module_for}


def main():
    parser = harness.parser(__doc__, threads=2, rounds=41)
    parser.add_argument("--peers", action="store_true", help="im2col and torch in the rounds")
    args = parser.parse_args()
    threads = args.threads
    torch_run = torch_peer(threads) if args.peers else None
    rng = np.random.default_rng(0)
    totals = {}
    labels = {name: name for name in ("from bounds", "constants")}
    print(f"{threads} thread(s), float32; times of the loop nest alone")
    for layer, plan in harness.row_plan_layers(threads, MODULES):
        x = rng.standard_normal(layer.x_shape).astype(np.float32)
        w = rng.standard_normal(layer.w_shape).astype(np.float32)
        variant = MODULES[plan.algorithm](plan, fixed_plane=False)
        programs = harness.variant_programs(
            layer, plan, x, w, "constants", "from bounds", variant
        )
        if args.peers:
            stride, padding, groups = layer.stride, layer.padding, layer.groups
            programs["im2col"] = lambda: im2col_gemm(x, w, stride, padding, groups)
            if torch_run is not None:
                programs["torch"] = lambda: torch_run(x, w, stride, padding, groups)
        samples = round_times(programs, args.rounds)
        harness.report_paired(layer, plan, samples, totals, "from bounds", "constants", labels)
    harness.report_paired_totals(totals, "from bounds", "constants", labels)


if __name__ == "__main__":
    main()
