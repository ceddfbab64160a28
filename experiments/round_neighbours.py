"""What the benchmark's rounds cost a depthwise call: alone and warm, and after each program.

    python experiments/round_neighbours.py [--model efficientnet_b0] [--threads 2]
                                           [--rounds 200] [--layers NAME ...]

For each depthwise layer of the model, ``cso.conv2d`` is timed twice:

* ``alone``: called back to back, nothing else run between (its input,
  output, code and Python path warm), best of ``--rounds`` calls;
* in the rounds ``python -m cso bench`` runs (``cso.conv2d``, the call with
  filters packed ahead, im2col + NumPy matmul, torch when installed and the
  compulsory-bytes stream, one call each a round in a fresh seeded shuffle),
  grouped by the program run just before it (``start``: first of its round,
  after the previous round's last): each group's best and median.

Also the roofline bound the benchmark uses (the stream run warm, or the FMA
time at the peak, whichever is longer).  Totals over the model's depthwise
calls give each column's share of that bound: how far the warm nests are
from it, and what each neighbour adds.  Nothing asserts a speed.  The
benchmark runs im2col on as many BLAS threads as cso's, its workers made to
sleep at once: for the same rounds, set ``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` to ``--threads`` and
``OPENBLAS_THREAD_TIMEOUT=4`` (the harness pins them to 1 otherwise).
"""

from __future__ import annotations

import harness  # noqa: E402,F401  (pins BLAS threads before NumPy loads)

import statistics  # noqa: E402


import cso  # noqa: E402
from cso.bench import stream_program  # noqa: E402
from cso.measure import best_times, im2col_gemm, timed_rounds  # noqa: E402
from cso.microkernels.stream import stream_seconds  # noqa: E402

PROGRAMS = ("cso", "packed", "im2col", "torch", "stream")


def layer_programs(layer, threads: int, torch_run) -> tuple:
    """``(programs, output_bytes, compulsory_bytes)``: the benchmark's
    programs for one layer, cso's result checked against the reference."""
    x, w, result = harness.checked_operands(layer, threads)
    params = layer.params
    packed = cso.pack_filters(w, x.shape, threads=threads, **params)
    programs = {
        "cso": lambda: cso.conv2d(x, w, threads=threads, **params),
        "packed": lambda: cso.conv2d(x, packed, threads=threads),
        "im2col": lambda: im2col_gemm(x, w, layer.stride, layer.padding, layer.groups),
        "stream": stream_program(x.nbytes + w.nbytes, result.nbytes, threads),
    }
    if torch_run is not None:
        programs["torch"] = lambda: torch_run(x, w, layer.stride, layer.padding, layer.groups)
    for program in programs.values():  # compiled, and the buffers touched
        program()
    return programs, result.nbytes, x.nbytes + w.nbytes


def by_predecessor(programs: dict, rounds: int) -> dict:
    """``{predecessor: [seconds of cso's call after it]}`` over ``rounds``
    rounds of every program once, in :func:`cso.measure.timed_rounds`'
    order (the benchmark's)."""
    samples: dict = {}
    before, last_round = "start", None
    for index, name, seconds in timed_rounds(programs, rounds):
        if index != last_round:
            before, last_round = "start", index
        if name == "cso":
            samples.setdefault(before, []).append(seconds)
        before = name
    return samples


def main():
    parser = harness.parser(__doc__, model="efficientnet_b0", threads=2, rounds=200, layers=None)
    args = parser.parse_args()
    layers, peak, torch_run = harness.depthwise_setting(args)
    columns = ["bound", "alone", "start"] + [p for p in PROGRAMS if p != "cso"]
    if torch_run is None:
        columns.remove("torch")
    totals = dict.fromkeys(columns, 0.0)
    print(
        f"{args.model}, {args.threads} thread(s), FMA peak {peak:.0f} GFLOP/s; cso.conv2d in "
        "microseconds: alone (best), and after each program in the rounds (best/median)"
    )
    print(f"{'layer':<22} {'n':>2} " + " ".join(f"{c:>13}" for c in columns))
    for layer in layers:
        programs, output_bytes, read_bytes = layer_programs(layer, args.threads, torch_run)
        alone = best_times({"cso": programs["cso"]}, args.rounds)["cso"]
        samples = by_predecessor(programs, args.rounds)
        memory = stream_seconds(read_bytes, output_bytes, args.threads, 5)
        best = {"bound": max(memory, layer.flops / (peak * 1e9)), "alone": alone}
        cells = [f"{best['bound'] * 1e6:>13.1f}", f"{alone * 1e6:>13.1f}"]
        for name in columns[2:]:
            times = samples.get(name, [float("nan")])
            best[name] = min(times)
            cells.append(f"{min(times) * 1e6:>6.1f}/{statistics.median(times) * 1e6:<6.1f}")
        for name in columns:
            totals[name] += best[name] * layer.count
        print(f"{layer.name:<22} {layer.count:>2} " + " ".join(cells), flush=True)
    calls = sum(layer.count for layer in layers)
    print(
        f"{'total (best)':<22} {calls:>2} " + " ".join(f"{totals[c] * 1e6:>13.1f}" for c in columns)
    )
    print("share of the bound: " + ", ".join(
        f"{c} {totals['bound'] / totals[c]:.0%}" for c in columns[1:]
    ))  # fmt: skip


if __name__ == "__main__":
    main()
