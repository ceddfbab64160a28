"""What each Python step of a repeated depthwise call costs, timed as the bench times it.

    python experiments/call_steps.py [--model efficientnet_b0] [--threads 2]
                                     [--rounds 40] [--layers NAME ...]

For each depthwise layer of the model, timed in interleaved rounds with the
benchmark's peers (im2col + NumPy matmul, and torch when installed), one
call of each program a round, best of each round as ``python -m cso bench``
times them, every result checked bit for bit against ``cso.conv2d``'s:

* ``call``: ``cso.conv2d`` as a user calls it;
* ``least``: the fewest Python steps a call can take: a new output
  (``np.empty``), the flat operands, the arguments the plan's nest takes
  (its workspace made once, outside the rounds), and the compiled launch;
* ``+key``: ``least`` plus ``cso.conv2d``'s lookup of the validated problem;
* ``+count``: ``least`` plus a query of Numba's thread count from Python
  (:func:`cso.executor.numba_thread_count`) before a parallel launch;
* ``+align``: ``least`` with the output 64-byte aligned
  (:func:`cso.packing.filters.aligned_empty`) and then shaped;
* ``+workspace``: ``least`` with the calling thread's kept workspace looked
  up (:func:`cso.workspace.workspace`) every call (the nests that read a
  constant instead, :class:`cso.launch.Launch`, still take it).

Each step is cheap with the caches warm (well under a microsecond); right
after the peers have run, every line and page a step touches is a miss.
Prints each layer's times and the totals over the model's depthwise calls,
and each step's cost a call (its program's total less ``least``'s, over
the calls).  Nothing asserts a speed.
"""

from __future__ import annotations

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso import executor  # noqa: E402
from cso import launch as launches  # noqa: E402
from cso.macrokernel.workers import launch_workers  # noqa: E402
from cso.measure import best_times, im2col_gemm, torch_peer  # noqa: E402
from cso.packing.filters import aligned_empty  # noqa: E402
from cso.workspace import placeholder, workspace  # noqa: E402

STEPS = ("call", "least", "+key", "+count", "+align", "+workspace")


def step_programs(plan, x, w, params: dict, threads: int) -> dict:
    """``least`` and each step added to it, for ``plan`` on ``x`` and ``w``."""
    dtype = np.dtype(plan.dtype)
    shape = plan.geometry.output_shape
    size = int(np.prod(shape))
    filters = executor.filter_operands(w, None, plan)
    launch = launches.launch_for(plan, filters.packed)
    kept = aligned_empty(max(1, launch.workspace_elements), dtype)
    kept[:] = 0
    constant = launch.constant_workspace if launch.constant_workspace is not None else kept
    fused = (filters.bias, filters.has_bias, placeholder(1, dtype), 0, False)
    tail = (launch.offsets, launch.bounds)
    nest = launch.loop_nest
    nest(*executor.loop_arguments(launch, x, filters, np.empty(size, dtype)))  # its address found
    settings = tuple(sorted(params.items()))
    lookups = {(x.shape, x.dtype, w.shape, w.dtype, None, settings): plan}

    def run(arguments):
        if threads == 1:
            nest(*arguments)
        else:
            launch_workers(nest.address, nest.workers, nest.counts, *arguments)

    def least(x, w, look=False, count=False, align=False, own=False):
        if look:
            lookups.get((x.shape, x.dtype, w.shape, w.dtype, None, settings))
        if align:
            y = aligned_empty(size, dtype)
            shaped = y.reshape(shape)
        else:
            shaped = np.empty(shape, dtype)
            y = shaped.reshape(-1)
        scratch = constant
        if own:
            scratch = workspace(launch.workspace_elements, dtype)
            if launch.constant_workspace is not None:
                scratch = constant  # looked up, as before the constant, but not read
        if count:
            executor.numba_thread_count()
        run((x.ravel(), w.ravel()) + fused + (y, scratch) + tail)
        return shaped

    return {
        "least": lambda: least(x, w),
        "+key": lambda: least(x, w, look=True),
        "+count": lambda: least(x, w, count=True),
        "+align": lambda: least(x, w, align=True),
        "+workspace": lambda: least(x, w, own=True),
    }


def main():
    parser = harness.parser(__doc__, model="efficientnet_b0", threads=2, rounds=40, layers=None)
    args = parser.parse_args()
    layers = harness.depthwise_layers(args.model, args.layers)
    torch_run = torch_peer(args.threads)
    totals = dict.fromkeys(STEPS, 0.0)
    print(f"{args.model}, {args.threads} thread(s); microseconds, best of interleaved rounds")
    print(f"{'layer':<22} {'n':>2} " + " ".join(f"{name:>10}" for name in STEPS))
    for layer in layers:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = layer.params
        expected = cso.conv2d(x, w, threads=args.threads, **params)
        plan = cso.plan_conv2d(x.shape, w.shape, threads=args.threads, **params)
        programs = {"call": lambda: cso.conv2d(x, w, threads=args.threads, **params)}
        for name, program in step_programs(plan, x, w, params, args.threads).items():
            if not np.array_equal(program(), expected):
                raise SystemExit(f"{layer.name}: {name} differs from cso.conv2d")
            programs[name] = program
        programs["im2col"] = lambda: im2col_gemm(x, w, layer.stride, layer.padding, layer.groups)
        if torch_run is not None:
            programs["torch"] = lambda: torch_run(x, w, layer.stride, layer.padding, layer.groups)
        best = best_times(programs, args.rounds)
        for name in STEPS:
            totals[name] += best[name] * layer.count
        cells = " ".join(f"{best[name] * 1e6:10.1f}" for name in STEPS)
        print(f"{layer.name:<22} {layer.count:>2} {cells}", flush=True)
    calls = sum(layer.count for layer in layers)
    print(f"{'total':<22} {calls:>2} " + " ".join(f"{totals[n] * 1e6:10.1f}" for n in STEPS))
    for name in STEPS:
        if name != "least":
            extra = (totals[name] - totals["least"]) / calls * 1e6
            print(f"{name:<10} costs {extra:5.1f} us a call beside least")


if __name__ == "__main__":
    main()
