"""Do two calibrations of one machine pick the same plans?

    python experiments/calibration_stability.py A.json B.json [--models resnet50,vgg16]
                                                [--threads 1,2] [--packed] [--time]

Two records written by ``python -m cso calibrate --output`` (run one after
the other on the same machine) are turned into weights
(:func:`cso.analysis.calibration.derive_weights`) and every layer of the
models is planned with each, at each thread count.  Prints the weights
that differ, every layer whose plans differ (micro-kernel, schedule,
tiles, folding) and the share of layers planned alike: the calibration is
deterministic enough to matter when that share is at least 95%.  Pure
planning unless ``--time``: then each layer planned differently is run
with both plans side by side (interleaved rounds, results checked against
each other), and what the differences cost is printed: each ratio, and
the total over those layers with the second record's plans against the
first's.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace

import numpy as np

import harness  # noqa: E402,F401

import cso  # noqa: E402
from cso.analysis.calibration import derive_weights  # noqa: E402
from cso.analysis.calibration_store import rates_from_record  # noqa: E402
from cso.analysis.detect import stored_or_probed  # noqa: E402
from cso.analysis.weights import TABLE_LABELS, TABLE_WEIGHTS  # noqa: E402
from cso.measure import best_times, plan_program  # noqa: E402
from cso.models import MODELS  # noqa: E402
from forced_shapes import describe  # noqa: E402


def decisions(plan) -> str:
    """Everything the analysis decided, as text (equal text, equal plans):
    the family, tiles and kernel, and a tap or row plan's rows a call."""
    return f"{plan.algorithm.value} {describe(plan)} rows={plan.rows_per_call}"


# Each per-shape (or per-kind) table and the weight it overrides.
SHAPE_WEIGHTS = TABLE_WEIGHTS


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--models", default="resnet50,vgg16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--packed", action="store_true", help="plan for filters packed ahead")
    parser.add_argument("--time", action="store_true",
                        help="time both plans of each layer planned differently")  # fmt: skip
    args = parser.parse_args()
    machine = stored_or_probed()
    hardware = []
    for path in (args.first, args.second):
        with open(path) as handle:
            rates = rates_from_record(json.load(handle))
        hardware.append(replace(machine, weights=derive_weights(rates)))
    for field in fields(hardware[0].weights):
        a, b = (getattr(h.weights, field.name) for h in hardware)
        if field.name in SHAPE_WEIGHTS:
            label = TABLE_LABELS[field.name]
            for shape in sorted(dict(a).keys() | dict(b).keys()):
                # A shape absent from a record's table takes the record's shared
                # weight (mac_cost, in_place_filter_cost or input_pack_cost).
                costs = [dict(pairs).get(shape) for pairs in (a, b)]
                if costs[0] != costs[1]:
                    shown = ["shared" if cost is None else f"{cost:g}" for cost in costs]
                    print(f"  {label + ' ' + shape:<24} {shown[0]:>10} {shown[1]:>10}")
        elif a != b:
            print(f"  {field.name:<24} {a:>10g} {b:>10g}")
    same = total = 0
    timed = []
    for model in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            for layer in MODELS[model]():
                plans = [
                    cso.plan_conv2d(
                        layer.x_shape,
                        layer.w_shape,
                        **layer.params,
                        threads=threads,
                        hardware=h,
                        filters_prepacked=args.packed,
                    )
                    for h in hardware
                ]
                total += 1
                if decisions(plans[0]) == decisions(plans[1]):
                    same += 1
                else:
                    ratio = timed_ratio(layer, plans) if args.time else None
                    shown = "" if ratio is None else f"  second / first {ratio[1] / ratio[0]:.3f}"
                    print(f"{model} T={threads} {layer.name}: {decisions(plans[0])} "
                          f"vs {decisions(plans[1])}{shown}")  # fmt: skip
                    if ratio is not None:
                        timed.append(ratio)
    print(f"planned alike: {same} of {total} layers ({same / total:.1%})")
    if timed:
        first, second = (sum(pair[i] for pair in timed) for i in range(2))
        worst = max(max(a / b, b / a) for a, b in timed)
        print(
            f"the {len(timed)} layers planned differently: {second * 1e3:.3f} ms with the second "
            f"record's plans against {first * 1e3:.3f} ms ({second / first:.3f}x); the plans of "
            f"one layer at most {worst:.3f}x apart"
        )
    return 0


def timed_ratio(layer, plans):
    """``(t_first, t_second)``: the layer's two plans, best of interleaved rounds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    programs = {index: plan_program(plan, x, w) for index, plan in enumerate(plans)}
    outputs = [programs[index]().copy() for index in range(2)]
    bound = 1e-3 * max(1.0, float(np.abs(outputs[0]).max()))
    if not np.allclose(outputs[0], outputs[1], rtol=1e-3, atol=bound):
        raise AssertionError(f"{layer.name}: the two plans compute different results")
    best = best_times(programs, rounds=9, min_seconds=0.5)
    return best[0], best[1]


if __name__ == "__main__":
    raise SystemExit(main())
