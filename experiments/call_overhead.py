"""What one ``cso.conv2d`` call costs beyond its arithmetic, on a tiny layer.

    python experiments/call_overhead.py [--threads T]

A 1x1 convolution of 16 channels on an 8x8 plane (16 filters, some 33
thousand multiply-adds, well under a microsecond of arithmetic), timed side
by side in one process, median of many calls each:

* ``cso.conv2d``: the public call (validation, plan, filters, loop nest);
* ``_run``: the same plan and prepared filters through the loop nest only
  (what the call adds to it is Python);
* the loop nest alone, called with its operands ready;
* im2col + NumPy matmul, and torch when installed.

Prints microseconds per call.  The medians, not the best, since these are
a few microseconds and the best is a lucky one.
"""

from __future__ import annotations

import time

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso import executor  # noqa: E402
from cso import launch as launches  # noqa: E402
from cso.measure import im2col_gemm, torch_peer  # noqa: E402


def _medians(programs, calls=3000):
    """Median seconds per call of each program, in interleaved rounds of 100 calls."""
    samples = {name: [] for name in programs}
    for program in programs.values():
        program()
    for _ in range(calls // 100):
        for name, program in programs.items():
            for _ in range(100):
                start = time.perf_counter()
                program()
                samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(times)) for name, times in samples.items()}


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    threads = args.threads
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 8, 8), dtype=np.float32)
    w = rng.standard_normal((16, 16, 1, 1), dtype=np.float32)
    plan = cso.plan_conv2d(x.shape, w.shape, threads=threads)
    y = np.empty(plan.geometry.output_shape, np.float32)
    filters = executor.filter_operands(w, None, plan)
    launch = launches.launch_for(plan, filters.packed)
    operands = executor.loop_arguments(launch, x, filters, y)
    programs = {
        "cso.conv2d": lambda: cso.conv2d(x, w, threads=threads),
        "executor.run (nest and launch)": lambda: executor.run(plan, x, filters, y),
        "loop nest alone": lambda: launch.loop_nest(*operands),
        "im2col + matmul": lambda: im2col_gemm(x, w, 1, 0),
    }
    torch_run = torch_peer(threads)
    if torch_run is not None:
        programs["torch"] = lambda: torch_run(x, w, 1, 0)
    for name, seconds in _medians(programs).items():
        print(f"{name:<34} {seconds * 1e6:7.1f} us")
    print(f"x {x.shape}, w {w.shape}, float32, {threads} thread(s); median of 3000 calls each")


if __name__ == "__main__":
    main()
