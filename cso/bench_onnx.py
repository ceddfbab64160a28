"""``python -m cso bench --onnx MODEL.onnx``: a whole model, cso against onnxruntime.

Both sessions are made once; then each runs the same input in turn, round
after round in one process (:func:`cso.measure.best_times`), and the table
gives each one's best round.  cso's result is checked against onnxruntime's
(or, without onnxruntime, against ``onnx.reference``) within a bound
derived from the reduction lengths, and its time is split into the fused
convolutions, the other operators, and layout work (operators that only
move data).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .measure import best_times

# Operators that compute nothing: they copy, reshape or reorder data.
LAYOUT_OPERATORS = frozenset(
    {"Reshape", "Flatten", "Transpose", "Concat", "Slice", "Gather", "Shape", "Squeeze",
     "Unsqueeze", "Identity", "Dropout", "Cast"}
)  # fmt: skip


def model_flops(session) -> tuple:
    """``(flops, reduction_lengths)`` of the convolutions (and matrix products
    run as convolutions) of one run of ``session``, a
    :class:`cso.onnx.InferenceSession` that has run once (so that every
    convolution's filters are packed for its input)."""
    geometries = [packed.plan.geometry for packed in session.packed_layers().values()]
    return sum(g.flops for g in geometries), [g.reduction_length for g in geometries]


def logits_bound(lengths, dtype=np.float32) -> float:
    """Relative bound on the logits' error: each layer's sum of ``L`` products
    is off by at most ``(L + 2) u`` relative to its magnitudes, and the layers
    compound, so ``2 u sum(L + 2)`` over the layers (``u`` the unit
    round-off).  A worst case: real errors are orders of magnitude below."""
    u = np.finfo(dtype).eps / 2
    return 2 * u * sum(length + 2 for length in lengths)


def step_times(session, feed, rounds=3) -> dict:
    """Best seconds per category (``convolution``, ``layout``, ``other``) of
    ``session``'s run, each step's best over ``rounds`` runs
    (:meth:`cso.onnx.InferenceSession.profile`)."""
    totals = {"convolution": 0.0, "other": 0.0, "layout": 0.0}
    for step in session.profile(feed, rounds):
        if step.op_type == "Conv":
            kind = "convolution"
        else:
            kind = "layout" if step.op_type in LAYOUT_OPERATORS else "other"
        totals[kind] += step.seconds
    return totals


def run_onnx_benchmark(path, threads=1, batch=1, rounds=10, min_seconds=2.0, peak=None, out=None):
    """Time ``path`` in cso and onnxruntime side by side; print and return the figures."""
    out = sys.stdout if out is None else out
    import cso
    import cso.onnx

    from .microkernels.peak import fma_peak_gflops

    created = time.perf_counter()
    session = cso.onnx.InferenceSession(path, threads=threads)
    creation = time.perf_counter() - created
    (model_input,) = session.get_inputs()
    shape = tuple(d if isinstance(d, int) else batch for d in model_input.shape)
    feed = {model_input.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    started = time.perf_counter()
    (ours,) = session.run(None, feed)[:1]
    first_run = time.perf_counter() - started
    programs = {"cso": lambda: session.run(None, feed)}
    reference_name = "onnxruntime"
    try:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        peer = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        programs["onnxruntime"] = lambda: peer.run(None, feed)
        (expected,) = peer.run(None, feed)[:1]
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        reference_name = "onnx.reference"
        (expected,) = ReferenceEvaluator(str(path)).run(None, feed)[:1]
    flops, lengths = model_flops(session)
    error = float(np.max(np.abs(ours - expected)) / max(np.max(np.abs(expected)), 1e-30))
    bound = logits_bound(lengths)
    best = best_times(programs, rounds, min_seconds)
    split = step_times(session, feed)
    peak_per_core = peak or fma_peak_gflops("float32", cso.detect_hardware().vector_bytes // 4)
    peak_total = peak_per_core * threads
    print(f"model {path}, input {shape}, {threads} thread(s), float32", file=out)
    print(f"{'program':<12} {'best ms':>9} {'GFLOP/s':>9} {'of peak':>8}", file=out)
    for name, seconds in best.items():
        rate = flops / seconds / 1e9
        print(f"{name:<12} {seconds * 1e3:9.2f} {rate:9.1f} {rate / peak_total:8.1%}", file=out)
    if "onnxruntime" in best:
        print(
            f"speedup of cso over onnxruntime: {best['onnxruntime'] / best['cso']:.2f}x "
            "(onnxruntime's time / cso's; above 1 means cso is faster)",
            file=out,
        )
    total = sum(split.values())
    print(
        "cso's time by step kind (each step's best): "
        + ", ".join(f"{k} {v * 1e3:.2f} ms ({v / total:.0%})" for k, v in split.items()),
        file=out,
    )
    print(
        f"conv/gemm FLOPs {flops / 1e9:.2f} G over {len(lengths)} convolutions; FMA peak "
        f"{peak_per_core:.1f} GFLOP/s per core",
        file=out,
    )
    verdict = "within" if error <= bound else "OUTSIDE"
    print(
        f"max |cso - {reference_name}| / max |{reference_name}| = {error:.2e}, {verdict} the "
        f"bound {bound:.1e} from the reduction lengths",
        file=out,
    )
    print(f"session made in {creation:.2f} s; first run {first_run:.2f} s", file=out)
    return {"best": best, "split": split, "error": error, "bound": bound, "flops": flops}
