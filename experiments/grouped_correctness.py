"""Correctness of every grouped and depthwise shape in a seeded ConvBench sample.

Reads ../shared/data/convbench_public.csv (never copied into the project),
draws ``--sample`` rows (seeded; every size), and checks each one with
``groups > 1`` against the float64 reference (im2col + GEMM), in float32 and
float64, at one thread and at two, per call and with filters packed ahead,
three calls each (the first, the repeated call and its quick call), within
the error bound the tests use (``gamma_(L+3) * |x| * |w|``, ``L`` the
reduction length).  Prints a line per shape (the algorithm the analysis
chose, the worst error as a share of its bound) and a summary.

Usage: python experiments/grouped_correctness.py [--sample 300] [--seed 0]
"""

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import csv
import pathlib
import sys
import time

import numpy as np

import cso
from cso.geometry import make_geometry

DATA = (
    pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "convbench_public.csv"
)


# Calls of each problem checked: the first, the repeated call, its quick call.
CALLS = 3


def problem(row):
    keys = ("N", "C", "H", "W", "K", "R", "S", "groups")
    n, c, h, w, k, r, s, g = (int(row[key]) for key in keys)
    params = dict(
        stride=(int(row["stride_h"]), int(row["stride_w"])),
        padding=(
            (int(row["pad_top"]), int(row["pad_bottom"])),
            (int(row["pad_left"]), int(row["pad_right"])),
        ),
        dilation=(int(row["dil_h"]), int(row["dil_w"])),
        groups=g,
    )
    return (n, c, h, w), (k, c // g, r, s), params, row["bias"] == "True"


def sampled_rows(path, size: int, seed: int) -> tuple:
    """``(rng, rows)``: ``size`` rows of the ConvBench CSV at ``path`` drawn
    with a generator seeded by ``seed`` (which draws the operands after), in
    file order; exits with a message when the file is missing."""
    if not pathlib.Path(path).exists():
        sys.exit(f"no data at {path}")
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    rng = np.random.default_rng(seed)
    return rng, [rows[i] for i in sorted(rng.choice(len(rows), min(size, len(rows)), False))]


def worst_share(y, expected, magnitude, dtype, reduction) -> float:
    """Largest ``|y - expected| / bound`` (at most 1 when correct)."""
    u = np.finfo(dtype).eps / 2
    terms = reduction + 3
    bound = terms * u / (1 - terms * u) * magnitude + np.finfo(dtype).tiny
    return float(np.max(np.abs(y.astype(np.float64) - expected) / bound))


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, sample = sampled_rows(args.data, args.sample, args.seed)
    grouped = [row for row in sample if int(row["groups"]) > 1]
    threads = sorted({1, min(2, cso.executor.available_threads())})
    print(f"{len(sample)} shapes sampled (seed {args.seed}); {len(grouped)} grouped or depthwise; "
          f"threads {threads}; float32 and float64, per call and packed", flush=True)
    failures, worst, kinds = [], 0.0, {}
    started = time.perf_counter()
    for index, row in enumerate(grouped, 1):
        x_shape, w_shape, params, has_bias = problem(row)
        geometry = make_geometry(x_shape, w_shape, **params)
        x = rng.standard_normal(x_shape)
        w = rng.standard_normal(w_shape)
        b = rng.standard_normal(w_shape[0]) if has_bias else None
        expected = cso.reference.conv2d(x, w, b, **params)
        magnitude = cso.reference.conv2d(np.abs(x), np.abs(w), None, **params)
        if b is not None:
            magnitude += np.abs(b).reshape(1, -1, 1, 1)
        shares = []
        for dtype in (np.float32, np.float64):
            xd, wd = x.astype(dtype), w.astype(dtype)
            bd = None if b is None else b.astype(dtype)
            for count in threads:
                plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, threads=count, **params)
                packed = cso.pack_filters(wd, x_shape, bias=bd, threads=count, **params)
                for label, run in (
                    ("call", lambda: cso.conv2d(xd, wd, bd, threads=count, **params)),
                    ("packed", lambda: cso.conv2d(xd, packed, threads=count)),
                ):
                    # The first call plans, the second takes the repeated call,
                    # the third its quick call (cso.repeated): each checked.
                    for repeat in range(CALLS):
                        share = worst_share(
                            run(), expected, magnitude, dtype, geometry.reduction_length
                        )
                        shares.append(share)
                        if not share <= 1.0:
                            failures.append(
                                (row["key"], np.dtype(dtype).name, count, label, repeat, share)
                            )
        depthwise = plan.algorithm in ("depthwise", "depthwise_lanes")
        kind = f"{plan.algorithm}" + ("" if depthwise else
                                      f" ({geometry.channels_per_group} ch/group)")
        kinds[plan.algorithm] = kinds.get(plan.algorithm, 0) + 1
        worst = max(worst, max(shares))
        print(f"[{index}/{len(grouped)}] {row['key'][:64]:<64} {kind:<22} worst error "
              f"{max(shares):.3f} of its bound {'ok' if max(shares) <= 1 else 'WRONG'}", flush=True)
    print(f"\n{len(grouped)} grouped or depthwise shapes of {len(sample)} sampled: "
          f"{', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}; "
          f"{len(grouped) * 2 * len(threads) * 2 * CALLS} results checked in "
          f"{time.perf_counter() - started:.0f} s; worst error {worst:.3f} of its bound; "
          f"{'all correct' if not failures else f'{len(failures)} WRONG'}")
    for failure in failures:
        print("WRONG:", *failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
