"""Breadth: a seeded sample of ConvBench shapes, checked and timed against im2col + GEMM.

Reads ../shared/data/convbench_public.csv (never copied into the project).
For every sampled shape: cso's result against the float64 reference (within
the error bound the tests use), then cso and im2col + NumPy matmul (float32)
timed in interleaved rounds, one thread.  Prints a line per shape and a
summary; writes a CSV with --csv.

Usage: python experiments/sampled_shapes.py [--count 100] [--min-gflop 0.02]
       [--max-gflop 0.5] [--groups any|none] [--seed 0] [--csv FILE]
"""


import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)
import csv
import os
import pathlib
import sys

import numpy as np

if __name__ == "__main__" and os.environ.get("OPENBLAS_NUM_THREADS") != "1":
    # Pin BLAS to one thread (it reads this at start-up), like cso's threads=1;
    # only when run, so that other experiments can import the sample's helpers.
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_THREAD_TIMEOUT="4",
    )
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

import cso  # noqa: E402
from cso.measure import best_times  # noqa: E402

DATA = (
    pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "convbench_public.csv"
)


def load(path, min_gflop, max_gflop, groups):
    with open(path) as handle:
        rows = [
            r
            for r in csv.DictReader(handle)
            if min_gflop <= float(r["gflop"]) <= max_gflop
            and (groups == "any" or r["groups"] == "1")
        ]
    return rows


def shapes(row):
    n, c, h, w, k, r, s, g = (
        int(row[key]) for key in ("N", "C", "H", "W", "K", "R", "S", "groups")
    )
    params = dict(
        stride=(int(row["stride_h"]), int(row["stride_w"])),
        padding=(
            (int(row["pad_top"]), int(row["pad_bottom"])),
            (int(row["pad_left"]), int(row["pad_right"])),
        ),
        dilation=(int(row["dil_h"]), int(row["dil_w"])),
        groups=g,
    )
    return (n, c, h, w), (k, c // g, r, s), params


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--min-gflop", type=float, default=0.02)
    parser.add_argument("--max-gflop", type=float, default=0.5)
    parser.add_argument("--groups", choices=["any", "none"], default="none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=None)
    args = parser.parse_args()
    if not pathlib.Path(args.data).exists():
        sys.exit(f"no data at {args.data}")
    rows = load(args.data, args.min_gflop, args.max_gflop, args.groups)
    rng = np.random.default_rng(args.seed)
    sample = [
        rows[i] for i in sorted(rng.choice(len(rows), min(args.count, len(rows)), replace=False))
    ]
    results = []
    for index, row in enumerate(sample):
        x_shape, w_shape, params = shapes(row)
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        y = cso.conv2d(x, w, threads=1, **params)
        expected = cso.reference.conv2d(x, w, **params)
        bound = (
            cso.reference.conv2d(np.abs(x), np.abs(w), **params)
            * ((np.prod(w_shape[1:]) + 3) * np.finfo(np.float32).eps / 2)
            + np.finfo(np.float32).tiny
        )
        packed = cso.pack_filters(w, x_shape, threads=1, **params)
        correct = bool(
            np.all(np.abs(y - expected) <= bound)
            and np.all(np.abs(cso.conv2d(x, packed, threads=1) - expected) <= bound)
        )
        programs = {
            "cso": lambda: cso.conv2d(x, w, threads=1, **params),
            "packed": lambda: cso.conv2d(x, packed, threads=1),
            "im2col": lambda: cso.reference.conv2d(x, w, dtype=np.float32, **params),
        }
        best = best_times(programs)
        gflop = float(row["gflop"])
        result = {
            "key": row["key"],
            "gflop": gflop,
            "correct": correct,
            "cso_gflops": gflop / best["cso"],
            "im2col_gflops": gflop / best["im2col"],
            "speedup": best["im2col"] / best["cso"],
            "packed_speedup": best["im2col"] / best["packed"],
            "packed_kernel": packed.plan.vector_operand,
        }
        results.append(result)
        print(
            f"[{index + 1}/{len(sample)}] {row['key'][:60]:<60} {gflop:6.3f} GFLOP "
            f"cso {result['cso_gflops']:6.1f} im2col {result['im2col_gflops']:6.1f} GF/s "
            f"x{result['speedup']:.2f} packed x{result['packed_speedup']:.2f} "
            f"{'ok' if correct else 'WRONG'}",
            flush=True,
        )
    print(
        f"\n{len(results)} shapes ({args.groups} groups, {args.min_gflop}-{args.max_gflop} GFLOP), "
        f"one thread: all correct: {all(r['correct'] for r in results)}"
    )
    for name, key in (("cso", "speedup"), ("cso with filters packed ahead", "packed_speedup")):
        speedups = np.array([r[key] for r in results])
        print(
            f"{name} against im2col + GEMM: faster on {np.mean(speedups > 1):.0%}; speedup "
            f"median {np.median(speedups):.2f}, min {speedups.min():.2f}, geometric mean "
            f"{np.exp(np.mean(np.log(speedups))):.2f}"
        )
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(results[0]))
            writer.writeheader()
            writer.writerows(results)


if __name__ == "__main__":
    main()
