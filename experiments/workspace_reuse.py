"""Kept scratch memory against scratch allocated per call, per layer.

    python experiments/workspace_reuse.py [--model resnet50|vgg16] [--threads T] [--rounds R]

The loop nests pack input panels into scratch memory (``cso.workspace``).
cso keeps that memory from one call to the next on each Python thread.
This script times each distinct layer's ``cso.conv2d`` two ways, interleaved
in one process (best of the rounds, each round ``--repeat`` calls back to
back, as a model run on one layer shape or a training loop would make
them): with the kept workspace, and with it dropped before every call
(``cso.workspace.release()``), which allocates fresh scratch each time as
cso did before it kept any.  Fresh memory of more than ~128 KiB comes from
``mmap`` and faults on each page's first touch; the script shows what that
costs against the arithmetic.
"""

from __future__ import annotations

import time

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso import workspace  # noqa: E402
from cso.models import MODELS  # noqa: E402


def _timed(call, repeat):
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    totals = {"kept": 0.0, "fresh": 0.0}
    print(f"{'layer':<28} {'n':>2} {'kept ms':>9} {'fresh ms':>9} {'fresh/kept':>11}")
    for layer in MODELS[args.model]():
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        params = dict(layer.params, threads=args.threads)

        def kept():
            cso.conv2d(x, w, **params)

        def fresh():
            workspace.release()
            cso.conv2d(x, w, **params)

        programs = {"kept": kept, "fresh": fresh}
        best = {name: float("inf") for name in programs}
        for program in programs.values():
            program()
        for round_ in range(args.rounds):
            order = list(programs) if round_ % 2 == 0 else list(reversed(programs))
            for name in order:
                best[name] = min(best[name], _timed(programs[name], args.repeat))
        for name in totals:
            totals[name] += layer.count * best[name]
        print(
            f"{layer.name:<28} {layer.count:>2} {best['kept'] * 1e3:>9.3f} "
            f"{best['fresh'] * 1e3:>9.3f} {best['fresh'] / best['kept']:>10.2f}x",
            flush=True,
        )
    print(
        f"model {args.model}, batch 1, {args.threads} thread(s): every layer once per use, "
        f"kept {totals['kept'] * 1e3:.2f} ms, fresh {totals['fresh'] * 1e3:.2f} ms, "
        f"fresh/kept {totals['fresh'] / totals['kept']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
