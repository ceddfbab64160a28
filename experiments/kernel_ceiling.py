"""The micro-kernel's ceiling on this machine: cso's generated kernels against hand-written C.

    python experiments/kernel_ceiling.py [--depth D] [--rounds R]

One thread, float32, every operand L1-resident (one tile called over and
over).  Prints, as GFLOP/s and shares of the FMA peak (cso's probe,
:func:`cso.microkernels.peak.fma_peak_gflops`):

* cso's micro-kernels (LLVM vector IR through Numba): every shape the
  planner offers on this machine (:func:`cso.calibrate.kernel_probes.planner_shapes`:
  on AVX-512 the windows-in-the-vectors 8x32, 14x32 and 8x48 and the
  filters-in-the-vectors 32x14; on AVX2 4x24, 6x16, 8x8 and 16x6), the
  filters-in-the-vectors ones also written back one element at a time
  (``transposed_store=False``);
* the same shapes written independently in C with AVX-512 intrinsics
  (``experiments/kernel_ceiling.c``, built with ``gcc -O3 -march=native``;
  skipped, with a message, when there is no gcc or no AVX-512), whose 32x14
  keeps its tile in registers' order (no transpose): the ceiling of the
  loop itself;
* the C 8x32 loop with its operands held in registers ("no loads"): the
  FMA peak reached by a loop of this shape.

If cso's kernels and the C ones reach the same share, and both stay below
"no loads", the gap to the peak is the machine's (loads issued beside two
FMAs per cycle), not cso's code generation: no layer can run its
multiply-adds faster than this.  Rounds alternate between cso and the C
program; each figure is the best round.
"""

from __future__ import annotations


import harness
import subprocess
import sys
import time

import numpy as np
from numba import njit

from cso.analysis.detect import detect_hardware
from cso.analysis.shape_tables import kernel_shape_key
from cso.calibrate.kernel_probes import planner_shapes
from cso.microkernels.outer_product import build_outer_product_kernel
from cso.microkernels.peak import fma_peak_gflops
from cso.packing.filters import aligned_empty


def kernels(hardware) -> list:
    """``[(name, Nf, Nwin, vector operand, transposed store)]``: the shapes
    the planner offers on ``hardware``, named as the C program names its
    own (``8x32w``, ``32x14f``, ``32x14f element stores``)."""
    found = []
    for nf, nwin, operand in planner_shapes(hardware.vector_bytes, hardware.vector_registers):
        name = kernel_shape_key(nf, nwin, operand)
        found.append((name, nf, nwin, operand, True))
        if operand == "filters":
            found.append((f"{name} element stores", nf, nwin, operand, False))
    return found


def cso_runner(nf, nwin, operand, transposed, depth, lanes, tiles=1):
    """A function that calls one cso kernel ``calls`` times, on one tile or
    walking through ``tiles`` filter and input panels laid end to end; its
    flops per call."""
    kernel = build_outer_product_kernel(
        nf, nwin, "float32", lanes, operand, transposed_store=transposed
    )
    # The output tile's rows are a 14x14 plane apart, as in a layer's y.
    out_stride = nwin if operand == "windows" else 196

    @njit(nogil=True)
    def run(filters, inputs, out, bias, calls):
        for call in range(calls):
            tile = call % tiles
            kernel(
                depth,
                filters,
                tile * depth * nf,
                nf,
                1,
                inputs,
                tile * depth * nwin,
                nwin,
                out,
                0,
                out_stride,
                bias,
                0,
                True,
                False,
                out,
                0,
                0,
                False,
            )

    operands = [
        aligned_empty(size, np.float32)
        for size in (tiles * depth * nf, tiles * depth * nwin, nf * out_stride)
    ]
    for array in operands:
        array[:] = 1.0 / array.size
    bias = np.zeros(nf, np.float32)
    run(*operands, bias, 1)
    return (lambda calls: run(*operands, bias, calls)), 2 * nf * nwin * depth


def time_cso(runner, flops, seconds):
    run, calls = runner, max(1, int(seconds * 2e11 / flops))
    start = time.perf_counter()
    run(calls)
    return flops * calls / (time.perf_counter() - start) / 1e9


def time_c(binary, depth, seconds):
    output = subprocess.run(
        [str(binary), str(depth), str(seconds)], capture_output=True, text=True, check=True
    ).stdout
    rates = {}
    for line in output.splitlines():
        name, rate = line.rsplit(" ", 1)
        rates[name] = float(rate)
    return rates


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--depth", type=int, default=128, help="reduction steps per call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hardware = detect_hardware()
    lanes = hardware.vector_bytes // 4
    peak = fma_peak_gflops("float32", lanes)
    runners = {
        name: cso_runner(nf, nwin, operand, transposed, args.depth, lanes)
        for name, nf, nwin, operand, transposed in kernels(hardware)
    }
    binary, why_not = harness.build_c("kernel_ceiling.c", "kernel_ceiling")
    best_cso = dict.fromkeys(runners, 0.0)
    best_c = {}
    for _ in range(args.rounds):
        for name, (run, flops) in runners.items():
            best_cso[name] = max(best_cso[name], time_cso(run, flops, 0.2))
        if binary is not None:
            for name, rate in time_c(binary, args.depth, 0.2).items():
                best_c[name] = max(best_c.get(name, 0.0), rate)
    print(f"one thread, float32, L1-resident tile, depth {args.depth}; FMA peak {peak:.1f} GFLOP/s")
    if binary is None:
        print(f"(C kernels skipped: {why_not})")
    print(f"{'kernel':<24} {'cso GF/s':>9} {'peak':>5} {'C GF/s':>8} {'peak':>5}")
    for name in list(runners) + [n for n in best_c if n not in runners]:
        cso_cell = f"{best_cso[name]:9.1f} {best_cso[name] / peak:5.0%}" if name in runners else ""
        c_cell = f"{best_c[name]:8.1f} {best_c[name] / peak:5.0%}" if name in best_c else ""
        print(f"{name:<24} {cso_cell:>15} {c_cell:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
