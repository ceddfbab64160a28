"""The analysis' plans with one cost weight changed, against the shipped plans.

    python experiments/cost_weight.py --set stream_overlap=0.5 [--model resnet50]
                                      [--batch 1] [--threads 1] [--packed]
                                      [--rounds 7] [--list]

Plans every layer of the model twice: with the detected :class:`cso.Hardware`
as shipped, and with the ``--set`` fields replaced (``name=value``, any
float field of ``Hardware``, repeatable).  Where the two plans differ, both
run interleaved in one process (best of the rounds, and the median of
paired rounds), per call or, with
``--packed``, with the filters packed ahead for each plan; their results are
checked against each other.  ``--list`` prints the changed plans without
timing them.

Prints each changed layer's two plans, their times and the ratio
(shipped / changed: above 1 means the change is faster), then the totals over
the changed layers weighted by each layer's count in the model, and how many
changed layers are at least 3% faster or slower.  This is how a cost weight
is set: by the time the plans it changes take, not by the plans it keeps.
"""

from __future__ import annotations

import argparse
import dataclasses

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import paired_ratios, round_times  # noqa: E402
from cso.models import MODELS  # noqa: E402
from forced_shapes import check_agree, describe, program_for  # noqa: E402


def parse_setting(text):
    """``"stream_overlap=0.5"`` -> ``("stream_overlap", 0.5)``."""
    name, _, value = text.partition("=")
    fields = {field.name: field.type for field in dataclasses.fields(cso.CostWeights)}
    if fields.get(name) not in (float, "float"):
        floats = sorted(n for n, kind in fields.items() if kind in (float, "float"))
        raise argparse.ArgumentTypeError(
            f"--set takes NAME=VALUE with NAME a weight of cso.CostWeights "
            f"({', '.join(floats)}), got {text!r}"
        )
    return name, float(value)


def plan_pair(layer, batch, threads, packed, shipped, changed):
    """The layer's plan on the shipped hardware and on the changed one."""
    x_shape = (batch,) + tuple(layer.x_shape[1:])
    kwargs = dict(layer.params, threads=threads)
    return tuple(
        cso.plan_conv2d(x_shape, layer.w_shape, hardware=hw, filters_prepacked=packed, **kwargs)
        for hw in (shipped, changed)
    )


def programs_for(layer, batch, threads, packed, plans):
    """``{"shipped": program, "changed": program}`` on one seeded input."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(layer.x_shape[1:]), dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    kwargs = dict(layer.params)
    return {
        label: program_for(x, w, plan, threads, packed, **kwargs)
        for label, plan in zip(("shipped", "changed"), plans)
    }


def main():
    parser = harness.parser(__doc__)
    parser.add_argument(
        "--set", dest="settings", type=parse_setting, action="append", required=True
    )
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--packed", action="store_true", help="filters packed ahead")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--list", action="store_true", help="print the changed plans only")
    args = parser.parse_args()
    shipped = cso.detect_hardware()
    changed = shipped.with_changes(**dict(args.settings))
    mode = "packed ahead" if args.packed else "per call"
    setting = ", ".join(f"{name}={value:g}" for name, value in args.settings)
    print(f"{args.model}, batch {args.batch}, {args.threads} thread(s), filters {mode}: {setting}")
    totals = {"shipped": 0.0, "changed": 0.0}
    faster = slower = layers = 0
    paired_totals = []
    for layer in MODELS[args.model]():
        plans = plan_pair(layer, args.batch, args.threads, args.packed, shipped, changed)
        if describe(plans[0]) == describe(plans[1]):
            continue
        layers += 1
        print(f"{layer.name} (x{layer.count})")
        print(f"   shipped {describe(plans[0])}")
        print(f"   changed {describe(plans[1])}")
        if args.list:
            continue
        programs = programs_for(layer, args.batch, args.threads, args.packed, plans)
        check_agree(layer, programs, "the shipped plan")
        samples = round_times(programs, args.rounds, 0.3)
        best = {label: min(times) for label, times in samples.items()}
        for label in totals:
            totals[label] += best[label] * layer.count
        # The changed plan's time over the shipped one's, by best rounds and
        # by the median of paired rounds (cso.measure.paired_ratios).
        ratio = best["shipped"] / best["changed"]
        paired = paired_ratios(samples, "shipped")["changed"]
        paired_totals.append((paired, layer.count, best["shipped"]))
        faster += ratio >= 1.03
        slower += ratio <= 1 / 1.03
        print(
            f"   {best['shipped'] * 1e3:.3f} ms -> {best['changed'] * 1e3:.3f} ms: {ratio:.3f}x "
            f"(paired {paired:.3f}x)"
        )
    if args.list or not layers:
        print(f"{layers} plan(s) changed")
        return
    print(
        f"changed layers: {layers}, shipped {totals['shipped'] * 1e3:.2f} ms, "
        f"changed {totals['changed'] * 1e3:.2f} ms ({totals['shipped'] / totals['changed']:.3f}x); "
        f"{faster} at least 3% faster, {slower} at least 3% slower"
    )
    # Each layer's shipped time scaled by its paired ratio, summed.
    scaled = sum(count * shipped / ratio for ratio, count, shipped in paired_totals)
    weighed = sum(count * shipped for _, count, shipped in paired_totals)
    print(f"by paired rounds: changed total {weighed / scaled:.3f}x the shipped one's speed")


if __name__ == "__main__":
    main()
