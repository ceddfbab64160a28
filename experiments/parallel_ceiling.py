"""What two threads can reach at best: the FMA loop and the micro-kernels on both cores at once.

    python experiments/parallel_ceiling.py [--depth D] [--rounds R] [--seconds S]

The ceiling for ``scaling.py``'s target (two threads at 1.8x one).  Each
program runs alone on one thread, then as two copies at once on two threads
(Python threads released from the GIL, started together at a barrier, each
on its own operands); the scaling is the two copies' combined rate (all
their flops over the slower one's time) against the one thread's rate.
Programs, all float32 and touching no memory beyond L1:

* ``fma loop``: cso's peak probe (:mod:`cso.microkernels.peak`), registers only;
* cso's micro-kernels on one L1-resident tile called over and over (as in
  ``kernel_ceiling.py``): the shapes the planner offers on this machine,
  written back transposed in registers;
* the same kernels walking through many tiles, each thread its own, of
  ``--footprints`` KiB per thread (default 1024, inside L2, and 32768,
  beyond it): each call reads its filter panel and its input panel from
  there, as the loop nests' calls read theirs.

The threads share no data, so below 2x on one tile the limit is the
machine's clock or a neighbour on the host; a footprint that scales worse
than one tile measures what the two cores' traffic to a shared level costs,
and no layer whose operands come from that level can scale better.
Rounds alternate between programs and between one and two threads; each
figure is the best round.
"""

from __future__ import annotations


import harness
import sys
import threading
import time


from cso.microkernels.peak import FMA_CHAINS, fma_loop

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from kernel_ceiling import cso_runner, kernels  # noqa: E402

from cso.analysis.detect import detect_hardware  # noqa: E402


def fma_runner(lanes):
    """``(run(calls), flops per call)`` for the FMA loop, 100,000 iterations a call."""
    loop = fma_loop("float32", lanes)
    loop(1000)
    iterations = 100_000
    return (lambda calls: loop(iterations * calls)), iterations * FMA_CHAINS * lanes * 2


def rate(runners, flops, calls):
    """Combined GFLOP/s of ``runners`` (one per thread) each making ``calls`` calls at once."""
    barrier = threading.Barrier(len(runners))
    times = [0.0] * len(runners)

    def work(index):
        barrier.wait()
        start = time.perf_counter()
        runners[index](calls)
        times[index] = time.perf_counter() - start

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(runners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(runners) * flops * calls / max(times) / 1e9


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--depth", type=int, default=256, help="reduction steps per kernel call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.3, help="rough length of one timing")
    parser.add_argument(
        "--footprints", default="1024,32768", help="KiB of tiles per thread, comma-separated"
    )
    args = parser.parse_args()
    footprints = [int(text) for text in args.footprints.split(",") if text]
    hardware = detect_hardware()
    lanes = hardware.vector_bytes // 4
    programs = {"fma loop": [fma_runner(lanes), fma_runner(lanes)]}
    for name, nf, nwin, operand, transposed in kernels(hardware):
        if not transposed:
            continue
        # Two runners: each thread calls the kernel on its own operands.
        programs[name] = [cso_runner(nf, nwin, operand, True, args.depth, lanes) for _ in range(2)]
        tile_bytes = 4 * args.depth * (nf + nwin)
        for kib in footprints:
            tiles = max(1, kib * 1024 // tile_bytes)
            programs[f"{name} {kib} KiB"] = [
                cso_runner(nf, nwin, operand, True, args.depth, lanes, tiles) for _ in range(2)
            ]
    best = {(name, t): 0.0 for name in programs for t in (1, 2)}
    for _ in range(args.rounds):
        for name, pair in programs.items():
            flops = pair[0][1]
            calls = max(1, int(args.seconds * 2e11 / flops))
            for t in (1, 2):
                runners = [run for run, _ in pair[:t]]
                best[name, t] = max(best[name, t], rate(runners, flops, calls))
    print(f"float32, L1-resident, kernel depth {args.depth}, best of {args.rounds} rounds")
    print(f"{'program':<20} {'1 thread GF/s':>14} {'2 threads GF/s':>15} {'scaling':>8}")
    for name in programs:
        one, two = best[name, 1], best[name, 2]
        print(f"{name:<20} {one:14.1f} {two:15.1f} {two / one:7.2f}x")


if __name__ == "__main__":
    main()
