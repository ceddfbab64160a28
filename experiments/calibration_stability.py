"""Do two calibrations of one machine pick the same plans?

    python experiments/calibration_stability.py A.json B.json [--models resnet50,vgg16]
                                                [--threads 1,2] [--packed]

Two records written by ``python -m cso calibrate --output`` (run one after
the other on the same machine) are turned into weights
(:func:`cso.analysis.calibration.derive_weights`) and every layer of the
models is planned with each, at each thread count.  Prints the weights
that differ, every layer whose plans differ (micro-kernel, schedule,
tiles, folding) and the share of layers planned alike: the calibration is
deterministic enough to matter when that share is at least 95%.  Pure
planning: nothing is timed.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace

import harness  # noqa: E402,F401

import cso  # noqa: E402
from cso.analysis.calibration import derive_weights  # noqa: E402
from cso.analysis.calibration_store import rates_from_record  # noqa: E402
from cso.analysis.detect import stored_or_probed  # noqa: E402
from cso.analysis.weights import TABLE_WEIGHTS  # noqa: E402
from cso.models import MODELS  # noqa: E402
from forced_shapes import describe  # noqa: E402


def decisions(plan) -> str:
    """Everything the analysis decided, as text (equal text, equal plans)."""
    return f"{plan.algorithm.value} {describe(plan)}"


# Each per-shape (or per-kind) table and the weight it overrides.
SHAPE_WEIGHTS = TABLE_WEIGHTS


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--models", default="resnet50,vgg16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--packed", action="store_true", help="plan for filters packed ahead")
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
            weight = SHAPE_WEIGHTS[field.name]
            for shape in sorted(dict(a).keys() | dict(b).keys()):
                costs = [dict(pairs).get(shape, float("nan")) for pairs in (a, b)]
                if costs[0] != costs[1]:
                    print(f"  {weight + ' ' + shape:<24} {costs[0]:>10g} {costs[1]:>10g}")
        elif a != b:
            print(f"  {field.name:<24} {a:>10g} {b:>10g}")
    same = total = 0
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
                    print(f"{model} T={threads} {layer.name}: {decisions(plans[0])} "
                          f"vs {decisions(plans[1])}")  # fmt: skip
    print(f"planned alike: {same} of {total} layers ({same / total:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
