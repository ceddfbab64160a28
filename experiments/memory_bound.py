"""VGG-16's fully connected layers, as convolutions: how close to the memory bound?

    python experiments/memory_bound.py [--threads T] [--rounds R]

fc6 is a 7x7 convolution of a 7x7 input (411 MB of float32 filters, one
window), fc7 and fc8 are 1x1 convolutions of a 1x1 input (67 MB, 16 MB).
Each filter element is used once per image: 2 flops per 4 bytes, so at
batch 1 the time is the time to read the filters.  The bound is measured
here, not assumed: the best time of a vectorised read of an array of the
same size (NumPy's vectorised sum, split over as many threads), and each
program's filter bytes per second are printed against it.  Programs: cso per call, cso with filters
packed ahead, im2col + NumPy matmul (BLAS pinned to T threads) and torch
when installed, timed side by side in interleaved rounds.
"""

from __future__ import annotations


import harness
import os
import sys

parser = harness.parser(__doc__)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
# BLAS reads these when it loads: set them before NumPy is imported.
for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)
os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times, im2col_gemm, torch_peer  # noqa: E402
from cso.models import vgg16  # noqa: E402


def _reader(array, threads):
    """A streaming read of ``array`` by NumPy's vectorised float32 sum, split
    into ``threads`` contiguous parts summed at once (NumPy releases the GIL
    in reductions): the bound a program that must read those bytes meets."""
    parts = np.array_split(array, threads)
    pool = ThreadPoolExecutor(threads)

    def read():
        return sum(pool.map(np.sum, parts))

    return read


def main():
    numba.set_num_threads(args.threads)
    torch_run = torch_peer(args.threads)
    rng = np.random.default_rng(0)
    print(f"{args.threads} thread(s), batch 1, float32")
    print(
        f"{'layer':<24} {'MB':>6} {'read bound':>11} {'program':<8} {'ms':>8} {'GB/s':>7} "
        f"{'of bound':>8} {'kernel':>7}"
    )
    for layer in [layer for layer in vgg16() if layer.name.startswith("fc")]:
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        flat = w.reshape(-1)
        packed = cso.pack_filters(w, x.shape, threads=args.threads)
        plan = cso.plan_conv2d(x.shape, w.shape, threads=args.threads)
        programs = {
            "read": _reader(flat, args.threads),
            "cso": lambda: cso.conv2d(x, w, threads=args.threads),
            "packed": lambda: cso.conv2d(x, packed, threads=args.threads),
            "im2col": lambda: im2col_gemm(x, w, 1, 0),
        }
        if torch_run is not None:
            programs["torch"] = lambda: torch_run(x, w, 1, 0)
        for program in programs.values():
            program()
        expected = cso.reference.conv2d(x, w)
        for result in (cso.conv2d(x, w, threads=args.threads), cso.conv2d(x, packed)):
            bound = cso.reference.conv2d(np.abs(x), np.abs(w)) * (w[0].size + 3) * 2**-23
            assert np.all(np.abs(result - expected) <= bound), "wrong result"
        best = best_times(programs, args.rounds)
        read_rate = w.nbytes / best["read"] / 1e9
        kernels = {"cso": plan, "packed": packed.plan}
        for name, seconds in best.items():
            if name == "read":
                continue
            rate = w.nbytes / seconds / 1e9
            kernel = kernels.get(name)
            label = (
                f"{kernel.filters_per_tile}x{kernel.windows_per_tile}{kernel.vector_operand[0]}"
                if kernel
                else ""
            )
            print(
                f"{layer.name:<24} {w.nbytes / 1e6:6.0f} {read_rate:8.1f} GB/s {name:<8} "
                f"{seconds * 1e3:8.2f} {rate:7.1f} {rate / read_rate:8.0%} {label:>7}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
