"""An image larger than each worker's memory, convolved chunk by chunk with cso.dask.

    python experiments/dask_image.py [--size 8192] [--chunk 1024] [--memory 600MB]
                                     [--filters 16] [--kernel 5]

A 3-channel ``size x size`` float32 image, generated lazily on the workers
(so no process ever holds it), is convolved by a first-layer filter bank
(``--filters`` of ``--kernel`` squared, stride 1, "same" padding) on a
``distributed.LocalCluster`` whose workers each have ``--memory``, less than
the image; the output is reduced to per-filter means as it is made, so it
is not kept either.  Prints, for one worker and for two (one thread each):
the time, the throughput in GFLOP/s, the time the same graph takes to
make and read the image without convolving it, and each worker's peak
resident memory;
then the same convolution by ``cso.conv2d`` in this process on an image that
fits (``--chunk * 2`` square), one thread, for the throughput without Dask.
Point the same code at a real cluster with ``Client("tcp://scheduler:8786")``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np


def peak_memory_mib():
    """This process's peak resident memory (run on each worker)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def convolve_on_cluster(workers, args, w):
    import dask.array as da
    import distributed

    import cso.dask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True,
            memory_limit=args.memory, dashboard_address=None,
        )  # fmt: skip
    with cluster, distributed.Client(cluster) as client:
        # A warm-up on a small image: every worker loads the kernels it needs.
        small = da.random.default_rng(1).random((1, 3, 256, 256), dtype=np.float32,
                                                chunks=(1, 3, 128, 128))  # fmt: skip
        cso.dask.conv2d(small, w, padding="same", threads=1).mean().compute()
        image = da.random.default_rng(0).random(
            (1, 3, args.size, args.size), dtype=np.float32,
            chunks=(1, 3, args.chunk, args.chunk),
        )  # fmt: skip
        started = time.perf_counter()
        image.mean().compute()  # the image made and read alone: what Dask costs without cso
        alone = time.perf_counter() - started
        means = cso.dask.conv2d(image, w, padding="same", threads=1).mean(axis=(0, 2, 3))
        started = time.perf_counter()
        result = means.compute()
        seconds = time.perf_counter() - started
        peaks = client.run(peak_memory_mib)
    return seconds, alone, result, sorted(peaks.values())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192, help="image side (default 8192)")
    parser.add_argument("--chunk", type=int, default=1024, help="chunk side (default 1024)")
    parser.add_argument("--memory", default="600MB", help="memory limit per worker")
    parser.add_argument("--filters", type=int, default=16)
    parser.add_argument("--kernel", type=int, default=5)
    args = parser.parse_args(argv)
    import cso

    rng = np.random.default_rng(2)
    w = rng.standard_normal((args.filters, 3, args.kernel, args.kernel)).astype(np.float32)
    flops = 2 * args.filters * 3 * args.kernel**2 * args.size**2
    image_mib = 3 * 4 * args.size**2 / 2**20
    print(
        f"image 3 x {args.size} x {args.size} float32 ({image_mib:.0f} MiB), chunks of "
        f"{args.chunk}; {args.filters} filters {args.kernel}x{args.kernel}, 'same' padding; "
        f"workers of {args.memory}, one thread each; {flops / 1e9:.1f} GFLOP"
    )
    times = {}
    for workers in (1, 2):
        seconds, alone, _, peaks = convolve_on_cluster(workers, args, w)
        times[workers] = seconds
        print(
            f"{workers} worker(s): {seconds:7.2f} s, {flops / seconds / 1e9:6.1f} GFLOP/s "
            f"({alone:.2f} s of it making and reading the image alone); peak resident memory "
            f"per worker {', '.join(f'{p:.0f}' for p in peaks)} MiB"
        )
    print(f"two workers against one: {times[1] / times[2]:.2f}x")
    side = 2 * args.chunk
    local = rng.random((1, 3, side, side), dtype=np.float32)
    seconds = float("inf")
    for _ in range(4):  # the first loads the kernel; the best of the rest
        started = time.perf_counter()
        cso.conv2d(local, w, padding="same", threads=1)
        seconds = min(seconds, time.perf_counter() - started)
    local_flops = 2 * args.filters * 3 * args.kernel**2 * side**2
    print(
        f"cso.conv2d in this process, a {side}x{side} image, one thread: "
        f"{local_flops / seconds / 1e9:6.1f} GFLOP/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
