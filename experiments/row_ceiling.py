"""The row kernel's ceiling: cso's 5x5 row block against the same block in C.

    python experiments/row_ceiling.py [--channels 64] [--rounds 7]

One thread, float32, a 5x5 stride-1 depthwise layer of ``--channels``
14 x 14 planes (padding 2: EfficientNet-B0's ``dw 5x5 672 @14`` shape, a
few channels of it), small enough to stay in L1/L2, convolved over and
over in compiled code:

* cso: the row plan the analysis makes for it (blocks of 7 output rows of
  one 16-lane vector), its loop nest called from a compiled loop, so no
  Python or launch cost is counted;
* C (``experiments/row_ceiling.c``, built with ``gcc -O3 -march=native``;
  skipped, with a message, without gcc or AVX-512): the same block, same
  loads, masked FMAs and masked stores, with the plane's geometry known at
  compile time (``C, fixed geometry``) and passed at run time as cso's
  nest takes it (``C, run-time geometry``).

Each figure is the best of ``--rounds`` rounds (the programs alternate), as
nanoseconds a block and as a share of the block's FMA time at the
machine's peak (160 FMAs of 16 lanes: each of the plane's two blocks skips
the taps of its two window rows off the plane, 15 of 175; cso's probe,
:func:`cso.microkernels.peak.fma_peak_gflops`).  The results are checked
against the float64 reference.  On a Xeon (Sapphire Rapids, 2026-11-28,
the rows off the plane then read from a row of zeros, 175 FMAs a block):
cso 47-52 ns a block (47-51% of the peak), C with the geometry fixed 33-37
ns (65-73%), C with it passed at run time 39-44 ns (55-62%); 2026-11-29,
both skipping them: cso 29.1 ns (71%), C fixed 25.9 (80%), C at run time
32.4 (64%).
"""

from __future__ import annotations

import harness
import ctypes
import sys
import time

import llvmlite.binding as llvm
import numpy as np
from numba import njit

import cso
from cso import executor
from cso.analysis.choices import Algorithm
from cso.launch import launch_for
from cso.microkernels.peak import fma_peak_gflops

SIZE, TAPS, BLOCK = 14, 5, 7
# A block's taps on the plane: 7 x 25, less the 1 + 2 column-tap rows (x 5)
# of the two window rows off the plane above the first block (below the last).
FMAS_PER_BLOCK = BLOCK * TAPS * TAPS - 3 * TAPS


def operands(channels: int):
    """Input (with slack before and after, as the C block reads two floats
    past a row's ends), filters, and the float64 reference."""
    rng = np.random.default_rng(0)
    slack = np.zeros(channels * SIZE * SIZE + 128, np.float32)
    x = slack[64 : 64 + channels * SIZE * SIZE].reshape(1, channels, SIZE, SIZE)
    x[...] = rng.standard_normal(x.shape, dtype=np.float32)
    w = rng.standard_normal((channels, 1, TAPS, TAPS), dtype=np.float32)
    expected = cso.reference.conv2d(x, w, padding=TAPS // 2, groups=channels)
    return x, w, expected


def cso_program(x, w, expected):
    """A callable running the row plan's nest ``repeats`` times in compiled code."""
    channels = x.shape[1]
    params = dict(padding=TAPS // 2, groups=channels)
    plan = cso.plan_conv2d(x.shape, w.shape, threads=1, **params)
    if plan.algorithm != Algorithm.DEPTHWISE_ROWS or plan.rows_per_call != BLOCK:
        raise SystemExit(f"the analysis did not take a row plan of {BLOCK} rows here: {plan}")
    # Linking the nest's compiled code into the loop below reads its inline
    # assembly (the masked FMAs) again, which LLVM can only do once its
    # assembly parser is set up (cso does so as it generates a kernel; a nest
    # loaded from the cache generates none).
    llvm.initialize_native_asmparser()
    launch = launch_for(plan, True)
    y = np.empty(expected.shape, np.float32)
    arguments = executor.loop_arguments(launch, x, executor.filter_operands(w, None, plan), y)
    nest = launch.loop_nest.func  # worker 0 of 1

    @njit(nogil=True)
    def repeat(count, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
        for _ in range(count):
            nest(0, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)

    repeat(1, *arguments)
    check(y, expected, "cso")
    return lambda count: repeat(count, *arguments)


def c_programs(library, x, w, expected):
    """The C builds as callables of a repeat count (results checked)."""
    channels = x.shape[1]
    y = np.zeros(expected.size + 64, np.float32)
    pointer = ctypes.c_void_p
    common = [
        pointer(x.ctypes.data), pointer(w.ctypes.data), pointer(y.ctypes.data),
        ctypes.c_int(channels),
    ]  # fmt: skip
    last_block = SIZE - BLOCK
    # The closures hold the arrays the C code is given pointers into.
    held = (x, w, y)
    programs = {
        "C, fixed geometry": lambda count, held=held: library.run_fixed(
            *common, ctypes.c_long(count)
        ),
        "C, run-time geometry": lambda count, held=held: library.run_runtime(
            *common, ctypes.c_long(count), ctypes.c_int(SIZE), ctypes.c_int(SIZE),
            ctypes.c_int(last_block),
        ),  # fmt: skip
    }
    for name, program in programs.items():
        y[:] = 0
        program(1)
        check(y[: expected.size].reshape(expected.shape), expected, name)
    return programs


def check(result, expected, name):
    # 2 * R*S roundings of float32, each taken at the largest output: tighter
    # than the bound from the inputs' magnitudes (a false alarm is the worst
    # it can give), and held by cso and both C blocks on these operands.
    bound = 2 * TAPS * TAPS * np.finfo(np.float32).eps * np.abs(expected).max()
    error = float(np.max(np.abs(result - expected)))
    if not error <= bound:
        raise SystemExit(f"{name}: wrong result (error {error:.3g}, bound {bound:.3g})")


def main():
    parser = harness.parser(__doc__, rounds=7)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2000, help="layer calls a timing")
    args = parser.parse_args()
    if args.channels < 1:
        parser.error(f"--channels must be at least 1, got {args.channels}")
    x, w, expected = operands(args.channels)
    programs = {"cso row nest": cso_program(x, w, expected)}
    path, why_not = harness.build_c("row_ceiling.c", "row_ceiling.so", shared=True)
    library = None if path is None else ctypes.CDLL(str(path))
    if library is not None:
        programs.update(c_programs(library, x, w, expected))
    blocks = args.channels * 2
    best = dict.fromkeys(programs, float("inf"))
    for _ in range(args.rounds):
        for name, program in programs.items():
            start = time.perf_counter()
            program(args.repeats)
            best[name] = min(best[name], (time.perf_counter() - start) / args.repeats / blocks)
    peak = fma_peak_gflops("float32", 16)
    fma_seconds = FMAS_PER_BLOCK * 16 * 2 / (peak * 1e9)
    print(
        f"one thread, float32, dw 5x5 {args.channels} @14 (blocks of {BLOCK} rows x 1 vector), "
        f"FMA peak {peak:.1f} GFLOP/s: {fma_seconds * 1e9:.1f} ns a block at the peak"
    )
    if library is None:
        print(f"(C blocks skipped: {why_not})")
    for name, seconds in best.items():
        share = fma_seconds / seconds
        print(f"{name:<22} {seconds * 1e9:7.2f} ns a block  {share:5.0%} of the FMA peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
