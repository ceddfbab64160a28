"""``python -m cso bench``: cso against its peers, layer by layer, side by side.

Every layer is timed for each program in turn, round after round, inside
one process, so that the machine's noise hits all of them alike; the table
gives each program's best round, and the ratios compare those.  cso is
timed twice: ``cso.conv2d(x, w)`` (filters prepared in the call) and
``packed``, ``cso.conv2d(x, cso.pack_filters(w, ...))`` with the filters packed
ahead of time, as a deployed model would hold them (which also lets the
analysis use filter-vectorised micro-kernels).  Peers: im2col + NumPy matmul
(the BLAS NumPy links) and, when installed, torch (given the weights as they
are, on every call).

Each layer also gets a roofline bound: the longer of its FMA time at the
measured peak and the time this machine takes to stream its compulsory
bytes (read the input and filters once, write the output once; timed on
buffers of those sizes, so in the cache level that holds them,
:func:`cso.microkernels.stream.stream_seconds`).  ``roof`` is the share of
that bound a program reaches (100% would be the bound itself).  That
stream runs warm, back to back: at two threads each core keeps its share
of the bytes in its own L2, while the programs, timed in interleaved
rounds, find them where the program before left them.  So the same stream
is also timed as one more program in the rounds, beside the others, and
the summary gives each program's share of that bound too (``roofline
timed in the rounds``).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time

import numpy as np

from .analysis.choices import Algorithm
from .executor import numba_threads
from .measure import best_times, im2col_gemm, kernel_name, stage_times, torch_peer
from .microkernels.stream import stream_buffers, stream_once, stream_seconds
from .models import MODELS

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _progress(index, total, name, stream=sys.stderr):
    bar = "#" * (20 * index // total)
    stream.write(f"\r[{bar:<20}] {index}/{total} {name[:40]:<40}")
    stream.flush()


def run_benchmark(
    model="resnet50",
    batch=1,
    threads=1,
    rounds=5,
    min_seconds=0.3,
    csv_path=None,
    peak=None,
    breakdown=False,
    png_path=None,
    out=None,
):
    """Time every distinct layer of ``model``; print the table; return the rows.

    With ``breakdown``, also time the stages of cso's call (see
    :func:`cso.measure.stage_times`) and print where each layer's time goes.
    """
    out = sys.stdout if out is None else out
    import cso
    from .microkernels.peak import fma_peak_gflops

    layers = [layer.with_batch(batch) for layer in MODELS[model]()]
    hardware = cso.detect_hardware()
    lanes = max(1, hardware.vector_bytes // 4)
    peak_per_core = peak or fma_peak_gflops("float32", lanes)
    peak_total = peak_per_core * threads
    torch_run = torch_peer(threads)
    rng = np.random.default_rng(0)
    rows = []
    compile_started = time.perf_counter()
    for index, layer in enumerate(layers):
        _progress(index, len(layers), layer.name)
        x = rng.standard_normal(layer.x_shape, dtype=np.float32)
        w = rng.standard_normal(layer.w_shape, dtype=np.float32)
        kwargs = dict(layer.params)
        if index == 0:
            cso.conv2d(x, w, threads=threads, **kwargs)
            first_call = time.perf_counter() - compile_started
        packed = cso.pack_filters(w, x.shape, threads=threads, **kwargs)
        programs = {
            "cso": lambda: cso.conv2d(x, w, threads=threads, **kwargs),
            "packed": lambda: cso.conv2d(x, packed, threads=threads),
            "im2col": lambda: im2col_gemm(x, w, layer.stride, layer.padding, layer.groups),
        }
        if torch_run is not None:
            programs["torch"] = lambda: torch_run(x, w, layer.stride, layer.padding, layer.groups)
        for program in programs.values():  # warm-up, and a correctness guard
            program()
        expected = cso.reference.conv2d(x, w, **kwargs)
        error = max(
            float(np.max(np.abs(result - expected)))
            for result in (
                cso.conv2d(x, w, threads=threads, **kwargs),
                cso.conv2d(x, packed, threads=threads),
            )
        )
        plan = cso.plan_conv2d(x.shape, w.shape, threads=threads, **kwargs)
        output_bytes = 4 * int(np.prod(plan.geometry.output_shape))
        stream = stream_program(x.nbytes + w.nbytes, output_bytes, threads)
        stream()  # compiled, and its buffers touched, before the rounds
        best = best_times({**programs, _STREAM: stream}, rounds, min_seconds)
        streamed_in_rounds = best.pop(_STREAM)
        memory = stream_seconds(x.nbytes + w.nbytes, output_bytes, threads, rounds)
        arithmetic = layer.flops / (peak_total * 1e9)
        row = {
            "layer": layer.name,
            "count": layer.count,
            "gflop": layer.flops / 1e9,
            # IS and WS order the dense nests' loops; the other families have one nest.
            "schedule": plan.schedule if plan.algorithm == Algorithm.DENSE else "-",
            "kernel": kernel_name(plan),
            "packed_kernel": kernel_name(packed.plan),
            "max_abs_error": error,
            "depthwise": layer.depthwise,
            "compulsory_bytes": x.nbytes + w.nbytes + output_bytes,
            "bound": "mem" if memory > arithmetic else "fma",
            "bound_ms": max(memory, arithmetic) * 1e3,
            "rounds_bound": "mem" if streamed_in_rounds > arithmetic else "fma",
            "rounds_bound_ms": max(streamed_in_rounds, arithmetic) * 1e3,
        }
        for name, seconds in best.items():
            row[f"{name}_ms"] = seconds * 1e3
            row[f"{name}_gflops"] = layer.flops / seconds / 1e9
            row[f"{name}_peak_share"] = row[f"{name}_gflops"] / peak_total
            row[f"{name}_roofline_share"] = row["bound_ms"] / row[f"{name}_ms"]
            row[f"{name}_rounds_roofline_share"] = row["rounds_bound_ms"] / row[f"{name}_ms"]
        if breakdown:
            for stage, seconds in stage_times(plan, x, w, rounds).items():
                row[f"stage_{stage}_ms"] = seconds * 1e3
        rows.append(row)
    _progress(len(layers), len(layers), "done")
    sys.stderr.write("\n")
    peers = [name for name in ("im2col", "torch") if f"{name}_ms" in rows[0]]
    _print_table(rows, peers, out)
    if breakdown:
        _print_breakdown(rows, out)
    ours = ["cso", "packed"]
    totals = {name: sum(r[f"{name}_ms"] * r["count"] for r in rows) for name in ours + peers}
    flops = sum(r["gflop"] * r["count"] for r in rows)
    print(
        f"\nmodel {model}, batch {batch}, {threads} thread(s), float32; FMA peak "
        f"{peak_per_core:.1f} GFLOP/s per core ({peak_total:.1f} for {threads} thread(s))",
        file=out,
    )
    for name, total in totals.items():
        rate = flops / (total / 1e3)
        print(
            f"total {name:>6}: {total:9.2f} ms  {rate:7.1f} GFLOP/s  "
            f"{rate / peak_total:6.1%} of peak",
            file=out,
        )
    for name in ours:
        for peer in peers:
            print(
                f"speedup of {name} over {peer}: {totals[peer] / totals[name]:.2f}x "
                f"({peer}'s total time / {name}'s; above 1 means {name} is faster)",
                file=out,
            )
    _print_roofline(rows, ours + peers, out)
    if any(r["kernel"].startswith("wg") for r in rows):
        print(
            "GFLOP/s and shares of the peak and of the roofline count every layer's direct "
            "convolution, 2*K*C*R*S*P*Q FLOPs an image; the Winograd layers (kernel wg...) do "
            "2.25x fewer multiply-adds, so theirs can pass 100%",
            file=out,
        )
    print(f"first call (layer 1, compile or cache load included): {first_call:.2f} s", file=out)
    if csv_path:
        write_csv(rows, csv_path)
        print(f"wrote {csv_path}", file=out)
    if png_path:
        _chart(rows, peers, png_path, f"{model}, batch {batch}, {threads} thread(s)", out)
    return rows


def write_csv(rows, path) -> None:
    """Write ``rows`` (dicts) to the CSV file ``path``: every column any row
    has, in the order first seen, and an empty cell where a row has none
    (``--breakdown`` times only the stages a layer's family has: the lane
    nest's ``output unpacking`` is one)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


# The name the compulsory-bytes stream is timed under in the rounds.
_STREAM = "compulsory bytes streamed"


def stream_program(read_bytes: int, written_bytes: int, threads: int):
    """A callable streaming a layer's compulsory bytes once on ``threads``
    threads (:func:`cso.microkernels.stream.stream_once`), leaving the
    process's thread settings as it found them, as cso's calls do."""
    source, destination = stream_buffers(read_bytes, written_bytes)
    if threads == 1:
        return lambda: stream_once(source, destination, 1)

    def stream():
        with numba_threads(threads):
            stream_once(source, destination, threads)

    return stream


def _print_roofline(rows, programs, out):
    """Each program's time against the roofline bound, over all layers and
    over the depthwise ones: the bound streamed warm, and streamed in the
    rounds beside the programs."""
    groups = [("all layers", rows)]
    depthwise = [r for r in rows if r["depthwise"]]
    if depthwise:
        groups.append((f"{sum(r['count'] for r in depthwise)} depthwise layers", depthwise))
    for label, chosen in groups:
        for key, kind, how in (
            ("bound_ms", "bound", "roofline"),
            ("rounds_bound_ms", "rounds_bound", "roofline timed in the rounds"),
        ):
            bound = sum(r[key] * r["count"] for r in chosen)
            memory = sum(r["count"] for r in chosen if r[kind] == "mem")
            shares = ", ".join(
                f"{name} {bound / sum(r[f'{name}_ms'] * r['count'] for r in chosen):.0%}"
                for name in programs
            )
            print(
                f"{how}, {label}: bound {bound:.2f} ms ({memory} of "
                f"{sum(r['count'] for r in chosen)} layers memory-bound); share of it reached: "
                f"{shares}",
                file=out,
            )
    if depthwise and "torch" in programs:
        for name in ("cso", "packed"):
            ratio = sum(r["torch_ms"] * r["count"] for r in depthwise) / sum(
                r[f"{name}_ms"] * r["count"] for r in depthwise
            )
            print(f"depthwise layers, speedup of {name} over torch: {ratio:.2f}x", file=out)


def _print_breakdown(rows, out):
    stages = ["kernel", "input packing", "filters", "rest"]
    if any("stage_output unpacking_ms" in r for r in rows):
        # The lane nest (depthwise) transposes its pixels back to the output planes.
        stages.insert(2, "output unpacking")
    print(
        "\nwhere cso's time goes (share of each layer's total; by difference of variants;"
        " - : no such stage)", file=out,
    )  # fmt: skip
    print(f"{'layer':<28} {'total ms':>9} " + " ".join(f"{s:>16}" for s in stages), file=out)
    for r in rows:
        total = r["stage_total_ms"]
        shares = " ".join(
            f"{r[f'stage_{s}_ms'] / total:>16.0%}" if f"stage_{s}_ms" in r else f"{'-':>16}"
            for s in stages
        )
        print(f"{r['layer']:<28} {total:>9.3f} {shares}", file=out)


def _chart(rows, peers, path, title, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install '.[plot]')", file=sys.stderr)
        return
    names = [r["layer"] for r in rows]
    positions = np.arange(len(rows))
    figure, (speed, share) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    width = 0.8 / max(1, len(peers))
    for index, peer in enumerate(peers):
        ratios = [r[f"{peer}_ms"] / r["cso_ms"] for r in rows]
        speed.bar(positions + index * width - 0.4 + width / 2, ratios, width, label=f"vs {peer}")
    speed.axhline(1.0, color="black", linewidth=0.8)
    speed.set_ylabel("speedup of cso (peer time / cso time)")
    speed.legend()
    speed.set_title(title)
    for name in ["cso", "packed"] + peers:
        share.plot(positions, [100 * r[f"{name}_peak_share"] for r in rows], marker="o", label=name)
    share.set_ylabel("% of the FMA peak")
    top = max(100 * r[f"{name}_peak_share"] for r in rows for name in ["cso", "packed"] + peers)
    share.set_ylim(0, max(100, top * 1.05))
    share.axhline(100, color="black", linewidth=0.8)
    share.legend()
    share.set_xticks(positions)
    share.set_xticklabels(names, rotation=75, fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}", file=out)


def _print_table(rows, peers, out):
    header = (
        f"{'layer':<28} {'n':>2} {'GFLOP':>6} {'sch':>3} {'kernel':>8} {'cso GF/s':>9}"
        f" {'peak':>5} {'packed':>7} {'kernel':>8} {'peak':>5} {'bound':>5} {'roof':>5}"
    )
    for peer in peers:
        header += f" {peer + ' GF/s':>12} {'x ' + peer:>9} {'packed x':>9}"
    print(header, file=out)
    for r in rows:
        line = (
            f"{r['layer']:<28} {r['count']:>2} {r['gflop']:>6.3f} {r['schedule']:>3} "
            f"{r['kernel']:>8} {r['cso_gflops']:>9.1f} {r['cso_peak_share']:>5.0%} "
            f"{r['packed_gflops']:>7.1f} {r['packed_kernel']:>8} {r['packed_peak_share']:>5.0%}"
            f" {r['bound']:>5} {r['packed_roofline_share']:>5.0%}"
        )
        for peer in peers:
            line += (
                f" {r[peer + '_gflops']:>12.1f} {r[peer + '_ms'] / r['cso_ms']:>9.2f}"
                f" {r[peer + '_ms'] / r['packed_ms']:>9.2f}"
            )
        print(line, file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m cso bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model",
        default="resnet50",
        choices=list(MODELS),
    )
    parser.add_argument(
        "--onnx",
        default=None,
        metavar="MODEL.onnx",
        help="time this whole model in cso and onnxruntime instead (needs cso[onnx])",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv", default=None, help="write the per-layer rows to this CSV")
    parser.add_argument(
        "--png", default=None, help="write a chart (speedups, share of peak) here; needs matplotlib"
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the stages of each call: kernel, packing, the rest",
    )
    parser.add_argument(
        "--peak",
        type=float,
        default=None,
        help="FMA peak per core in GFLOP/s (default: measured now)",
    )
    args = parser.parse_args(argv)
    wanted = dict.fromkeys(_THREAD_VARIABLES, str(args.threads))
    # OpenBLAS workers spin for a while after each call and would steal the
    # cores from whichever program is timed next: make them sleep at once.
    wanted["OPENBLAS_THREAD_TIMEOUT"] = "4"
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        # BLAS reads these at start-up: rerun with them pinned, so the peers
        # use exactly as many threads as cso.
        env = dict(os.environ, **wanted)
        command = [sys.executable, "-m", "cso", "bench"] + (
            argv if argv is not None else sys.argv[2:]
        )
        return subprocess.call(command, env=env)
    if args.onnx is not None:
        from .bench_onnx import run_onnx_benchmark

        run_onnx_benchmark(args.onnx, args.threads, args.batch, peak=args.peak)
        return 0
    run_benchmark(
        args.model,
        args.batch,
        args.threads,
        args.rounds,
        csv_path=args.csv,
        peak=args.peak,
        breakdown=args.breakdown,
        png_path=args.png,
    )
    return 0
