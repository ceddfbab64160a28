"""Where a depthwise call's time goes: the call, its loop nest, one worker's share.

    python experiments/depthwise_call_parts.py [--model mobilenetv2_100] [--threads 2]
                                               [--rounds 50] [--layers NAME ...]

For each depthwise layer of the model, timed in interleaved rounds with the
benchmark's peers (im2col + NumPy matmul, and torch when installed), one
call of each program a round, best of each round as ``python -m cso bench``
times them:

* ``call``: ``cso.conv2d`` as a user calls it (the checks, the output, the
  thread settings, the parallel launch, the loop nest);
* ``nest``: the plan's loop nest alone, its operands ready (at two threads
  its parallel launch included);
* ``worker``: worker 0's share of that nest run alone on the calling thread
  (at one thread, the whole nest): the work one core does;
* ``bound``: the roofline bound as the benchmark's rounds time it (the
  layer's compulsory bytes streamed on the same threads, or the FMA time at
  the peak, whichever is longer).

Prints each layer's times and the totals over the model's depthwise calls:
``call - nest`` is what a call costs beside its nest, ``nest - worker`` what
running the workers in parallel costs beside one worker's share, and the
share of the bound each program reaches.  Nothing asserts a speed.
"""

from __future__ import annotations

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso import executor  # noqa: E402
from cso.bench import stream_program  # noqa: E402
from cso import launch as launches  # noqa: E402
from cso.measure import best_times, im2col_gemm, kernel_name  # noqa: E402


def layer_programs(layer, threads: int, torch_run) -> tuple:
    """``(plan, programs)`` for one layer: cso's call, its nest, worker 0's
    share, the stream and the peers; cso's result checked first."""
    x, w, _ = harness.checked_operands(layer, threads)
    params = layer.params
    plan = cso.plan_conv2d(x.shape, w.shape, threads=threads, **params)
    y = np.empty(plan.geometry.output_shape, np.float32)
    filters = executor.filter_operands(w, None, plan)
    launch = launches.launch_for(plan, filters.packed)
    operands = executor.loop_arguments(launch, x, filters, y)
    # A plan of several threads runs its nest through a parallel launch; its
    # compiled nest, called as worker 0, is that worker's share alone.
    nest = launch.loop_nest
    worker_nest = getattr(nest, "nest", None)
    programs = {
        "call": lambda: cso.conv2d(x, w, threads=threads, **params),
        "nest": lambda: executor.launch_nest(plan, launch, operands),
        "worker": (lambda: worker_nest(0, *operands)) if worker_nest else (lambda: nest(*operands)),
        "stream": stream_program(x.nbytes + w.nbytes, y.nbytes, threads),
        "im2col": lambda: im2col_gemm(x, w, layer.stride, layer.padding, layer.groups),
    }
    if torch_run is not None:
        programs["torch"] = lambda: torch_run(x, w, layer.stride, layer.padding, layer.groups)
    for program in programs.values():  # compiled, and the buffers touched
        program()
    return plan, programs


def main():
    parser = harness.parser(__doc__, model="mobilenetv2_100", threads=2, rounds=50, layers=None)
    args = parser.parse_args()
    layers, peak, torch_run = harness.depthwise_setting(args)
    names = ("call", "nest", "worker", "bound")
    totals = dict.fromkeys(names, 0.0)
    print(f"{args.model}, {args.threads} thread(s), FMA peak {peak:.0f} GFLOP/s; microseconds, "
          "best of interleaved rounds")  # fmt: skip
    print(f"{'layer':<22} {'n':>2} {'kernel':>9} " + " ".join(f"{n:>8}" for n in names))
    for layer in layers:
        plan, programs = layer_programs(layer, args.threads, torch_run)
        best = best_times(programs, args.rounds)
        best["bound"] = max(best["stream"], layer.flops / (peak * 1e9))
        for name in names:
            totals[name] += best[name] * layer.count
        cells = " ".join(f"{best[n] * 1e6:8.1f}" for n in names)
        print(f"{layer.name:<22} {layer.count:>2} {kernel_name(plan):>9} {cells}", flush=True)
    calls = sum(layer.count for layer in layers)
    cells = " ".join(f"{totals[n] * 1e6:8.1f}" for n in names)
    print(f"{'total':<22} {calls:>2} {'':>9} {cells}")
    print(
        f"beside its nest a call costs {(totals['call'] - totals['nest']) / calls * 1e6:.1f} us "
        f"on average; the parallel nest {(totals['nest'] - totals['worker']) / calls * 1e6:.1f} "
        "us beside one worker's share"
    )
    for name in ("call", "nest", "worker"):
        print(f"share of the bound reached by {name}: {totals['bound'] / totals[name]:.0%}")


if __name__ == "__main__":
    main()
