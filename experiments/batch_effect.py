"""What a batch changes, per image: one call on N images against N calls on one.

    python experiments/batch_effect.py [--batch 8] [--layers NAME ...] [--rounds 9]

The benchmark's batch-1 rows call each program again and again on the same
image, so its input and output stay in the caches between calls; at batch
8 every image is new.  To tell that apart from what batching itself does,
each program runs three ways per layer of ResNet-50, timed in interleaved
rounds (best of each), and is reported per image:

* ``batch``: one call on ``N`` images (what the benchmark's batch-N row times);
* ``N x 1, distinct``: ``N`` calls on one image each, every image new to the caches;
* ``N x 1, same``: ``N`` calls on the same image (the benchmark's batch-1 conditions).

``batch / distinct`` is what batching gains a program; ``same / distinct``
what warm caches flatter it with.  Programs: ``cso.conv2d`` (into a given
``out``, one thread) and torch's conv2d (one thread) when torch is installed.
"""

from __future__ import annotations

import os

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import cso  # noqa: E402
from cso.measure import best_times, torch_peer  # noqa: E402
from cso.models import resnet50  # noqa: E402

DEFAULT_LAYERS = ("l1 3x3 64 @56", "l1 1x1 256->64 @56", "l4 3x3 512 @7")


WAYS = ("batch", "distinct", "same")


def _ways(run_batch, run_image, batch):
    """``{way: program}`` of one program: ``run_batch()`` on all the images,
    ``run_image(i)`` on image ``i`` alone."""
    return {
        "batch": run_batch,
        "distinct": lambda: [run_image(i) for i in range(batch)],
        "same": lambda: [run_image(0) for _ in range(batch)],
    }


def main(argv=None) -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", nargs="+", default=list(DEFAULT_LAYERS))
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    layers = {layer.name: layer.with_batch(args.batch) for layer in resnet50()}
    unknown = [name for name in args.layers if name not in layers]
    if unknown:
        raise SystemExit(f"unknown layers {unknown}; ResNet-50's are {sorted(layers)}")
    torch_run = torch_peer(1)
    rng = np.random.default_rng(0)
    print(f"ResNet-50, one thread, GFLOP/s per image; batch {args.batch} against single images")
    print(
        f"{'layer':26} {'program':8} {'batch':>8} {'distinct':>9} {'same':>8} "
        f"{'batch/distinct':>15} {'same/distinct':>14}"
    )
    for name in args.layers:
        layer = layers[name]
        kwargs = dict(layer.params)
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        y = cso.conv2d(x, w, threads=1, **kwargs)
        error = float(np.max(np.abs(y - cso.reference.conv2d(x, w, **kwargs))))
        if not error < 1e-2:
            raise AssertionError(f"{name}: cso's error {error}")
        ways = {
            "cso": _ways(
                lambda: cso.conv2d(x, w, threads=1, out=y, **kwargs),
                lambda i: cso.conv2d(x[i : i + 1], w, threads=1, out=y[i : i + 1], **kwargs),
                args.batch,
            )
        }
        if torch_run is not None:
            # Arrays kept alive: the peer wraps one array at a time, keyed by its
            # id, which a view made and freed on each call could pass on.
            images = [x[i : i + 1] for i in range(args.batch)]
            ways["torch"] = _ways(
                lambda: torch_run(x, w, layer.stride, layer.padding, layer.groups),
                lambda i: torch_run(images[i], w, layer.stride, layer.padding, layer.groups),
                args.batch,
            )
        programs = {(who, way): run for who, runs in ways.items() for way, run in runs.items()}
        for program in programs.values():
            program()
        best = best_times(programs, args.rounds)
        for who in ways:
            # Every way does the N images' work: its rate is comparable per image.
            rate = {way: layer.flops / 1e9 / best[(who, way)] for way in WAYS}
            print(
                f"{name:26} {who:8} {rate['batch']:8.1f} {rate['distinct']:9.1f} "
                f"{rate['same']:8.1f} {rate['batch'] / rate['distinct']:14.3f}x "
                f"{rate['same'] / rate['distinct']:13.3f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
