"""Correctness of Winograd on every dense 3x3 stride-1 shape in a seeded ConvBench sample.

Reads ../shared/data/convbench_public.csv (never copied into the project),
draws ``--sample`` rows (seeded, as ``grouped_correctness.py`` draws them),
and checks each one with one group, 3x3 filters, stride and dilation 1
through a plan forced to Winograd against the float64 reference (im2col +
GEMM), in float32 and float64, at one thread and at two, per call and with
filters packed ahead (the transformed filters), three calls each (the first,
the repeated call and its quick call), within the Winograd error bound
(:func:`cso.reference.winograd_error_bound`: ``gamma_(C+16)`` times the
transforms' magnitudes).  Prints a line per shape (the family the analysis
takes unforced, the worst error as a share of its bound) and a summary.

Usage: python experiments/winograd_correctness.py [--sample 300] [--seed 0] [--largest 4000000]
"""

import harness  # noqa: F401  (pins BLAS threads before NumPy loads)
import sys
import time

import numpy as np
from grouped_correctness import DATA, problem, sampled_rows

import cso
from cso.analysis.winograd_rules import is_winograd
from cso.geometry import make_geometry
from cso.reference import winograd_error_bound

CALLS = 3


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--largest", type=int, default=4_000_000,
        help="skip shapes whose output has more elements (the float64 bound's memory)",
    )  # fmt: skip
    args = parser.parse_args()
    rng, sample = sampled_rows(args.data, args.sample, args.seed)
    chosen = []
    for row in sample:
        x_shape, w_shape, params, has_bias = problem(row)
        geometry = make_geometry(x_shape, w_shape, **params)
        outputs = geometry.batch * geometry.filters * geometry.windows
        if is_winograd(geometry) and outputs <= args.largest:
            chosen.append((row, x_shape, w_shape, params, has_bias))
    threads = sorted({1, min(2, cso.executor.available_threads())})
    print(f"{len(sample)} shapes sampled (seed {args.seed}); {len(chosen)} dense 3x3 stride-1 "
          f"(at most {args.largest} outputs); threads {threads}; float32 and float64, per call "
          "and packed", flush=True)  # fmt: skip
    failures, worst, taken = [], 0.0, 0
    started = time.perf_counter()
    for index, (row, x_shape, w_shape, params, has_bias) in enumerate(chosen, 1):
        x = rng.standard_normal(x_shape)
        w = rng.standard_normal(w_shape)
        b = rng.standard_normal(w_shape[0]) if has_bias else None
        expected = cso.reference.conv2d(x, w, b, **params)
        shares = []
        for dtype in (np.float32, np.float64):
            xd, wd = x.astype(dtype), w.astype(dtype)
            bd = None if b is None else b.astype(dtype)
            bound = winograd_error_bound(xd, wd, bd, dtype, **params)
            for count in threads:
                forced = dict(dtype=dtype, threads=count, algorithm="winograd", **params)
                plan = cso.plan_conv2d(x_shape, w_shape, **forced)
                ahead = cso.plan_conv2d(x_shape, w_shape, filters_prepacked=True, **forced)
                packed = cso.pack_filters(wd, x_shape, bias=bd, plan=ahead, **params)
                for label, run in (
                    ("call", lambda: cso.conv2d(xd, wd, bd, plan=plan, **params)),
                    ("packed", lambda: cso.conv2d(xd, packed, threads=count)),
                ):
                    for repeat in range(CALLS):
                        error = np.abs(run().astype(np.float64) - expected)
                        share = float(np.max(error / bound))
                        shares.append(share)
                        if not share <= 1.0:
                            failures.append(
                                (row["key"], np.dtype(dtype).name, count, label, repeat, share)
                            )
        unforced = cso.plan_conv2d(x_shape, w_shape, **params).algorithm
        taken += unforced == "winograd"
        worst = max(worst, max(shares))
        print(f"[{index}/{len(chosen)}] {row['key'][:64]:<64} model takes {unforced:<9} worst "
              f"error {max(shares):.3f} of its bound {'ok' if max(shares) <= 1 else 'WRONG'}",
              flush=True)  # fmt: skip
    print(f"\n{len(chosen)} dense 3x3 stride-1 shapes of {len(sample)} sampled ({taken} taken "
          f"Winograd unforced here); {len(chosen) * 2 * len(threads) * 2 * CALLS} results checked "
          f"in {time.perf_counter() - started:.0f} s; worst error {worst:.3f} of its bound; "
          f"{'all correct' if not failures else f'{len(failures)} WRONG'}")  # fmt: skip
    for failure in failures:
        print("WRONG:", *failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
