"""Does a tap-kernel block spill, and what does a spilling block cost?

    python experiments/tap_spills.py [--kernels 3,5,7] [--rows 7,10,12,13,14,16]
                                     [--vectors 1] [--filters 1] [--stride 1]
                                     [--channels 480] [--size 28] [--rounds 40]

For each filter height ``R`` and block of ``B`` output rows (``v`` vectors
a row, ``F`` filters a call, the given vertical stride): the live vectors
the analysis counts for the block (``tap_rules.tap_live_vectors``), the
zmm (or ymm) stack accesses and FMAs in the machine code of its column loop,
and the time of a depthwise layer (``F`` filters a group, ``--channels``
groups of ``--size`` x ``--size``) run in that block at one and at two
threads, each checked against the float64 reference.  The machine code is
read from a fresh compilation: the script points ``CSO_CACHE_DIR`` and
``NUMBA_CACHE_DIR`` at a temporary folder before it loads cso (Numba does
not show the code of functions it loaded from its cache).

The rule it checks (``tap_rules.max_tap_rows``): a one-filter block holds
no more rows than keep its live vectors within the vector registers.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import numpy as np


def column_loop(assembly: str) -> list:
    """The lines of the innermost loop with the most FMAs: a block whose
    label one of its own jumps targets."""
    blocks, label, lines = [], None, []
    for line in assembly.splitlines():
        if re.match(r"^\.?LBB\S*:", line.strip()):
            blocks.append((label, lines))
            label, lines = line.strip().rstrip(":"), []
        else:
            lines.append(line)
    blocks.append((label, lines))
    loops = [
        body
        for label, body in blocks
        if label and any(line.strip().startswith("j") and label in line for line in body)
    ]
    return max(loops, key=lambda body: sum("vfmadd" in line for line in body), default=[])


def spills(body: list) -> int:
    """Vector moves between a register and the stack in ``body``."""
    return sum(
        ("%rsp" in line or "%rbp)" in line) and ("zmm" in line or "ymm" in line)
        and "vfmadd" not in line
        for line in body
    )  # fmt: skip


def main():
    parser = harness.parser(__doc__, rounds=40)
    parser.add_argument("--kernels", default="3,5,7", help="filter heights R")
    parser.add_argument("--rows", default="7,10,12,13,14,16", help="blocks of output rows B")
    parser.add_argument("--vectors", type=int, default=1, help="vectors a row, v")
    parser.add_argument("--filters", type=int, default=1, help="filters a call (and a group), F")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--channels", type=int, default=480, help="groups of the layer timed")
    parser.add_argument("--size", type=int, default=28, help="output rows and columns")
    args = parser.parse_args()
    # A fresh compilation: Numba shows no machine code of what it loaded from
    # its cache, so cso is loaded only once both caches point at a new folder.
    scratch = tempfile.mkdtemp(prefix="cso-tap-spills-")
    os.environ["CSO_CACHE_DIR"] = os.path.join(scratch, "cso")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(scratch, "numba")
    try:
        measure(args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(args):
    import cso
    from cso.analysis import depthwise, tap_rules
    from cso.launch import launch_for
    from cso.measure import best_times, plan_program

    hardware = cso.detect_hardware()
    lanes = max(1, hardware.vector_bytes // 4)
    segment = args.vectors * lanes
    print(
        f"{hardware.vector_registers} vector registers, {lanes} lanes; {args.channels} groups "
        f"of {args.filters} filter(s), {args.size}x{args.size} outputs, stride {args.stride}"
    )
    print(f"{'R':>2} {'B':>3} {'live':>5} {'rule':>5} {'FMAs':>5} {'spills':>6} "
          f"{'1 thread':>10} {'2 threads':>10}")  # fmt: skip
    rng = np.random.default_rng(0)
    for height in (int(r) for r in args.kernels.split(",")):
        size_in = (args.size - 1) * args.stride + 1
        x = rng.standard_normal((1, args.channels, size_in, max(size_in, segment)))
        x = x.astype(np.float32)
        w = rng.standard_normal((args.channels * args.filters, 1, height, height))
        w = w.astype(np.float32)
        settings = dict(stride=args.stride, padding=height // 2, groups=args.channels)
        expected = cso.reference.conv2d(x, w, **settings)
        # float32 rounding of R*R products and their sum, each at most max|x| max|w|.
        taps = height * height
        bound = 4 * np.finfo(np.float32).eps * taps * taps * np.abs(x).max() * np.abs(w).max()
        base = cso.plan_conv2d(x.shape, w.shape, threads=1, algorithm="depthwise", **settings)
        g = base.geometry
        rule = tap_rules.max_tap_rows(
            args.vectors, height, hardware.vector_registers, args.filters, args.stride
        )
        for rows in (int(b) for b in args.rows.split(",")):
            live = tap_rules.tap_live_vectors(
                rows, args.vectors, height, args.filters, args.stride
            )
            cells, fmas, stack = [], "-", "-"
            for threads in (1, 2):
                traffic = depthwise.depthwise_traffic(
                    g, hardware, 4, segment, threads, rows, args.filters
                )
                try:
                    plan = depthwise.untiled_plan(
                        g, "float32", hardware, threads, traffic, depthwise.tap_algorithm(g),
                        segment, rows, args.filters,
                    )  # fmt: skip
                except ValueError:
                    cells.append("not a plan")
                    continue
                program = plan_program(plan, x, w)
                assert np.max(np.abs(program() - expected)) <= bound, "wrong result"
                if threads == 1:
                    nest = launch_for(plan, True).loop_nest.func  # worker 0's partial
                    body = column_loop(nest.inspect_asm(nest.signatures[0]))
                    fmas = sum("vfmadd" in line for line in body)
                    stack = spills(body)
                seconds = best_times({"block": program}, args.rounds)["block"]
                cells.append(f"{seconds * 1e6:8.1f}us")
            print(
                f"{height:>2} {rows:>3} {live:>5} {'ok' if rows <= rule else 'over':>5} "
                f"{fmas:>5} {stack:>6} {cells[0]:>10} {cells[1]:>10}",
                flush=True,
            )


if __name__ == "__main__":
    main()
