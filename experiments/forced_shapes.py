"""The analysis' plan against each micro-kernel shape forced on it, per layer.

    python experiments/forced_shapes.py [--model resnet50] [--batch 1] [--threads 2]
                                        [--shapes 14x32w,8x32w,32x14f] [--layers NAME ...]
                                        [--packed] [--rounds 7] [--cold [MIB]]

For every layer of the model (or the ``--layers`` named), the analysis' plan
and, for each of ``--shapes``, the plan the analysis makes when forced to
that micro-kernel (``NfxNwin`` and ``w``/``f``: windows or filters in the
vectors; the schedule, tiles and folding still the model's for that shape)
are timed interleaved in one process (best of the rounds), per call, or
with ``--packed`` with filters packed ahead for each plan.  Every forced
plan's result is checked against the model's plan's.  With ``--cold``, each
call takes the next of as many copies of the layer's operands as fill
``MIB`` (default 256, beyond the L3 of the machines measured), so that its
input and filters come from memory as in a model run, where each layer's
weights are read once an inference; by default one copy serves every call
and stays in the caches.

Prints each program's time and speed, the speedup of the fastest over the
model's plan where that is at least 3%, and the model's total against an
oracle that takes each layer's fastest program, two ways: by each
program's best round (an upper bound: the minimum of noisy timings flatters
the oracle by the noise), and by the median over rounds of each forced
plan's speed relative to the model's plan timed in the same round
(:func:`cso.measure.paired_ratios`; a layer's oracle is the model's time
over the largest such median, if above 1), which a drifting machine moves
less.  This is how a wrong
shape choice shows: the model picks by modelled cost, which does not count
everything that makes a narrower kernel slower inside the loop nest.
"""

from __future__ import annotations

import argparse

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import paired_ratios, round_times  # noqa: E402
from cso.models import MODELS  # noqa: E402

OPERANDS = {"w": "windows", "f": "filters"}


def parse_shape(text):
    """``"14x32w"`` -> ``(14, 32, "windows")``."""
    body, operand = text[:-1], text[-1]
    if operand not in OPERANDS or body.count("x") != 1:
        raise argparse.ArgumentTypeError(f"a shape is NfxNwin then w or f, got {text!r}")
    nf, nwin = (int(value) for value in body.split("x"))
    return nf, nwin, OPERANDS[operand]


def describe(plan):
    folded = "+" if plan.batch_folded else ""
    return (
        f"{plan.filters_per_tile}x{plan.windows_per_tile}{plan.vector_operand[0]} "
        f"{plan.schedule}{folded} Nc={plan.channel_tile} K2={plan.l2_tiles} "
        f"K3={plan.l3_tiles} parts={plan.window_parts}"
        + (" in place" if plan.input_in_place else "")
    )


def program_for(x, w, plan, threads, packed, **kwargs):
    """``plan`` run on ``x`` and ``w`` as a program of no arguments: per call,
    or with ``packed`` on filters packed ahead for it (packed here, once)."""
    return cycling_program([(x, w)], plan, threads, packed, **kwargs)


def cycling_program(operands, plan, threads, packed, **kwargs):
    """``plan`` run as a program of no arguments on ``operands``, a list of
    ``(x, w)`` copies each call takes the next of: per call, or with
    ``packed`` on filters packed ahead for it (packed here, once a copy)."""
    if packed:
        operands = [
            (x, cso.pack_filters(w, x.shape, threads=threads, plan=plan, **kwargs))
            for x, w in operands
        ]
        kwargs = {}
    else:
        kwargs = dict(kwargs, plan=plan)
    turn = [0]

    def program():
        x, w = operands[turn[0]]
        turn[0] = (turn[0] + 1) % len(operands)
        return cso.conv2d(x, w, threads=threads, **kwargs)

    return program


def check_agree(layer, programs, reference_name):
    """Raise if a program's result differs from the first one's by more than
    float32 sums taken in another order may: about ``C*R*S`` roundings."""
    # Every program is at its first copy of the operands: they compute alike.
    results = {label: program().copy() for label, program in programs.items()}
    reference = next(iter(results.values()))
    reduction = int(np.prod(layer.w_shape[1:]))
    tolerance = reduction * np.finfo(np.float32).eps * np.abs(reference).max()
    for label, result in results.items():
        if np.abs(result - reference).max() > tolerance:
            raise AssertionError(f"{layer.name}: {label} differs from {reference_name}")


def operand_copies(x_shape, w_shape, cold_bytes):
    """``[(x, w), ...]``: one pair, or as many as fill ``cold_bytes`` (at least two)."""
    rng = np.random.default_rng(0)
    pair_bytes = 4 * (int(np.prod(x_shape)) + int(np.prod(w_shape)))
    count = max(2, cold_bytes // pair_bytes) if cold_bytes else 1
    return [
        (
            rng.standard_normal(x_shape, dtype=np.float32),
            rng.standard_normal(w_shape, dtype=np.float32),
        )
        for _ in range(count)
    ]


def programs_for(layer, batch, threads, shapes, packed, cold_bytes=0):
    """``{label: program}``: the model's plan first, then each forced shape,
    each on its own turn through :func:`operand_copies`."""
    x_shape = (batch,) + tuple(layer.x_shape[1:])
    copies = operand_copies(x_shape, layer.w_shape, cold_bytes)
    kwargs = dict(layer.params)
    plans = [
        cso.plan_conv2d(
            x_shape, layer.w_shape, threads=threads, filters_prepacked=packed, **kwargs
        )
    ]
    for nf, nwin, operand in shapes:
        plans.append(
            cso.plan_conv2d(
                x_shape,
                layer.w_shape,
                threads=threads,
                filters_prepacked=packed,
                filters_per_tile=nf,
                windows_per_tile=nwin,
                vector_operand=operand,
                **kwargs,
            )
        )
    programs = {}
    for index, plan in enumerate(plans):
        label = ("model  " if index == 0 else "forced ") + describe(plan)
        if label[7:] in (key[7:] for key in programs):
            continue  # the model's own choice, forced again
        programs[label] = cycling_program(copies, plan, threads, packed, **kwargs)
    return programs


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", default="14x32w,8x32w,32x14f")
    parser.add_argument("--layers", nargs="*", help="layer names (default: all)")
    parser.add_argument("--packed", action="store_true", help="filters packed ahead")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--cold", type=int, nargs="?", const=256, default=0, metavar="MIB",
        help="cycle each program through copies of the operands filling MIB (default 256)",
    )  # fmt: skip
    args = parser.parse_args()
    shapes = [parse_shape(text) for text in args.shapes.split(",") if text]
    total_model = total_oracle = total_paired_oracle = 0.0
    mode = "packed ahead" if args.packed else "per call"
    state = f", operands cycled through {args.cold} MiB of copies" if args.cold else ""
    print(f"{args.model}, batch {args.batch}, {args.threads} thread(s), filters {mode}{state}")
    for layer in MODELS[args.model]():
        if args.layers and layer.name not in args.layers:
            continue
        programs = programs_for(
            layer, args.batch, args.threads, shapes, args.packed, args.cold << 20
        )
        check_agree(layer, programs, "the model's plan")
        samples = round_times(programs, args.rounds, 0.3)
        best = {label: min(times) for label, times in samples.items()}
        model_label = next(iter(programs))
        ratios = paired_ratios(samples, model_label)
        fastest = min(best, key=best.get)
        total_model += best[model_label] * layer.count
        total_oracle += best[fastest] * layer.count
        # The paired estimate: the model's plan's best time, over the largest
        # median ratio of a forced plan to it (1 when none is faster).
        paired_gain = max(1.0, max(ratios.values()))
        total_paired_oracle += best[model_label] / paired_gain * layer.count
        print(f"{layer.name} (x{layer.count})")
        flops = layer.flops * args.batch
        for label, seconds in best.items():
            print(
                f"   {label:<52} {seconds * 1e3:8.3f} ms {flops / seconds / 1e9:7.1f} GFLOP/s"
                f"   paired {ratios[label]:.3f}x the model's"
            )
        gain = best[model_label] / best[fastest]
        if gain >= 1.03:
            print(f"   -> {fastest[7:]} is {gain:.3f}x the model's plan's speed (best rounds)")
    print(
        f"total: model {total_model * 1e3:.2f} ms, oracle {total_oracle * 1e3:.2f} ms, "
        f"model / oracle {total_model / total_oracle:.3f}x (best rounds); "
        f"model / oracle {total_model / total_paired_oracle:.3f}x (paired rounds' medians)"
    )


if __name__ == "__main__":
    main()
