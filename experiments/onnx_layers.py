"""Where a whole model's time goes, cso's session against onnxruntime, layer by layer.

    python experiments/onnx_layers.py MODEL.onnx [--threads 1] [--rounds 20]

Runs the model in a ``cso.onnx.InferenceSession`` step by step
(``InferenceSession.profile``: best of ``--rounds`` per step, run as ``run`` runs)
and in onnxruntime with its profiler on (best of ``--rounds`` per node), then
matches each fused convolution to onnxruntime's node by output name (its
NCHWc convolutions are named ``<output>_nchwc``).  Prints the time by kind
of convolution (stem, depthwise, 1x1, other) with GFLOP/s, the convolutions
cso loses most time on, and the other operators' total.  Needs onnxruntime.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np


def onnxruntime_node_times(path, feed, threads, rounds):
    """Best seconds per onnxruntime node, from its profiler."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "profile")
    peer = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(rounds):
        peer.run(None, feed)
    with open(peer.end_profiling()) as handle:
        events = json.load(handle)
    times = collections.defaultdict(lambda: float("inf"))
    suffix = "_kernel_time"
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith(suffix):
            name = event["name"][: -len(suffix)]
            times[name] = min(times[name], event["dur"] / 1e6)
    return times


def kind_of(geometry):
    if geometry.groups == geometry.channels and geometry.groups > 1:
        return "depthwise"
    if geometry.channels_per_group <= 4:
        return "stem"
    if (geometry.kernel_height, geometry.kernel_width) == (1, 1):
        return "1x1"
    return f"{geometry.kernel_height}x{geometry.kernel_width}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an ONNX model (python ../shared/tools/export_onnx.py DIR)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=12, help="convolutions listed by time lost")
    args = parser.parse_args(argv)
    import cso.onnx

    session = cso.onnx.InferenceSession(args.model, threads=args.threads)
    (model_input,) = session.get_inputs()
    shape = tuple(d if isinstance(d, int) else 1 for d in model_input.shape)
    feed = {model_input.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    session.run(None, feed)
    ours = session.profile(feed, args.rounds)
    theirs = onnxruntime_node_times(args.model, feed, args.threads, args.rounds)
    kinds = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
    rows, other = [], 0.0
    for step in ours:
        if step.packed is None:
            other += step.seconds
            continue
        geometry = step.packed.plan.geometry
        # onnxruntime names a fused NCHWc convolution after its output.
        peer = next((theirs[n + "_nchwc"] for n in step.outputs if n + "_nchwc" in theirs), None)
        kind = kinds[kind_of(geometry)]
        kind[0] += step.seconds
        kind[1] += peer or 0.0
        kind[2] += geometry.flops
        kind[3] += 1
        rows.append((step.seconds - (peer or 0.0), step, geometry, peer))
    print(f"{args.model}, {args.threads} thread(s); best of {args.rounds} per step or node")
    print(f"{'kind':<10} {'count':>5} {'cso ms':>8} {'GFLOP/s':>8} {'ort ms':>8} {'GFLOP/s':>8}")
    for name, (seconds, peer, flops, count) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        peer_rate = flops / peer / 1e9 if peer else float("nan")
        print(
            f"{name:<10} {count:>5} {seconds * 1e3:8.2f} {flops / seconds / 1e9:8.1f} "
            f"{peer * 1e3:8.2f} {peer_rate:8.1f}"
        )
    print(f"cso's other operators: {other * 1e3:.2f} ms; onnxruntime's nodes in all: "
          f"{sum(t for t in theirs.values() if np.isfinite(t)) * 1e3:.2f} ms")  # fmt: skip
    print("convolutions cso loses most time on (ort 'n/a': not matched by name):")
    for lost, step, g, peer in sorted(rows, key=lambda row: -row[0])[: args.top]:
        plan = step.packed.plan
        kernel = f"{plan.algorithm}/{plan.filters_per_tile}x{plan.windows_per_tile}"
        activation = step.description.split(" -> ")[1] if " -> " in step.description else ""
        peer_text = f"{peer * 1e3:6.3f}" if peer else "   n/a"
        print(
            f"  C{g.channels:<5} K{g.filters:<5} {g.height:>3}x{g.width:<3} {g.kernel_height}x"
            f"{g.kernel_width}/{g.stride_h} g{g.groups:<5} {kernel:<18} "
            f"{activation:<8} cso {step.seconds * 1e3:6.3f} ort {peer_text} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
