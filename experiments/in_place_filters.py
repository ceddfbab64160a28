"""What reading KCRS filters in place costs a window-vectorised micro-kernel.

    python experiments/in_place_filters.py [--model resnet50|vgg16] [--rounds R]

Per call, a window-vectorised kernel (``Nf x 32``, windows in the vectors)
reads its ``Nf`` filters straight from the KCRS array: each reduction step
broadcasts one element from each of ``Nf`` rows ``C*R*S`` elements apart.
Packed ahead, the same kernel reads them from a contiguous ``[C*R*S][Nf]``
panel.  For every layer whose per-call plan is window-vectorised, this
script runs that very plan both ways, timed interleaved in one process
(best of the rounds, one thread; results identical bit for bit), and
prints the extra time per filter element read in place:
``(t_in_place - t_packed) / (padded MACs / Nwin)``, in nanoseconds and in
the cost model's units (``Hardware.mac_cost`` units are 4 per MAC, so the
script converts with the layer's own units-per-second at the packed time).
The median is what ``Hardware.in_place_filter_cost`` is set from.
"""

from __future__ import annotations

import statistics

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.analysis.explain_dense import padding_share  # noqa: E402
from cso.measure import best_times, plan_program  # noqa: E402
from cso.models import MODELS  # noqa: E402


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    per_element_ns, per_element_units = [], []
    print(
        f"{'layer':<28} {'plan':<14} {'in place ms':>11} {'packed ms':>10} {'ratio':>6} "
        f"{'ns/elem':>8} {'units/elem':>10}"
    )
    for layer in MODELS[args.model]():
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        plan = cso.plan_conv2d(
            x.shape, w.shape, **layer.params, threads=1
        )
        if plan.vector_operand != "windows":
            continue
        g = plan.geometry
        # The same plan reading panels packed ahead instead of KCRS in place.
        panels = cso.pack_filters(w, x.shape, **layer.params, plan=plan)
        programs = {
            "in place": plan_program(plan, x, w),
            "packed": plan_program(plan, x, w, prepacked=panels),
        }
        outputs = {name: program().copy() for name, program in programs.items()}
        assert np.array_equal(outputs["in place"], outputs["packed"])
        best = best_times(programs, args.rounds)
        macs = g.flops / 2 / (1 - padding_share(plan))
        elements = macs / plan.windows_per_tile
        extra = best["in place"] - best["packed"]
        cost = plan.cost_of(plan.schedule).cost
        units_per_second = cost / best["packed"]
        per_element_ns.append(extra / elements * 1e9)
        per_element_units.append(extra * units_per_second / elements)
        name = f"{plan.schedule} {plan.filters_per_tile}x{plan.windows_per_tile}w"
        print(
            f"{layer.name:<28} {name:<14} {best['in place'] * 1e3:>11.3f} "
            f"{best['packed'] * 1e3:>10.3f} {best['in place'] / best['packed']:>6.3f} "
            f"{per_element_ns[-1]:>8.3f} {per_element_units[-1]:>10.1f}",
            flush=True,
        )
    median_ns = statistics.median(per_element_ns)
    median_units = statistics.median(per_element_units)
    print(
        f"median extra per filter element read in place: {median_ns:.3f} ns, "
        f"{median_units:.1f} cost units ({len(per_element_ns)} layers)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
