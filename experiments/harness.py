"""What every experiment shares: BLAS pinning, the command line, the layers.

Each script in this folder answers one question and runs as
``python experiments/NAME.py [options]`` after ``pip install .``.  Import
this module before NumPy (``import harness``): it pins the BLAS threads to
one unless the caller set them, so that im2col + GEMM runs on the thread
count under test.  Timing itself is :func:`cso.measure.best_times`
(interleaved rounds, best of each); nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sys

# Before NumPy loads its BLAS: a peer must run on the thread count under test.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# Scripts import each other's helpers (e.g. kernel_ceiling.cso_runner).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """An argument parser described by ``doc`` (the script's docstring), with
    the common options named in ``defaults`` added with those defaults:
    ``model``, ``batch``, ``threads``, ``rounds`` and ``layers`` (a default
    list of layer names, or None for every layer)."""
    lines = (doc or "").strip().splitlines()
    result = argparse.ArgumentParser(
        description=lines[0] if lines else None,
        epilog="\n".join(lines[1:]) or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if "model" in defaults:
        from cso.models import MODELS

        result.add_argument("--model", default=defaults["model"], choices=sorted(MODELS))
    for name in ("batch", "threads", "rounds"):
        if name in defaults:
            result.add_argument(f"--{name}", type=int, default=defaults[name])
    if "layers" in defaults:
        names = defaults["layers"]
        result.add_argument(
            "--layers",
            nargs="*",
            default=names,
            help="layer names (default: " + ("all" if names is None else ", ".join(names)) + ")",
        )
    return result


def model_layers(model: str, names=None, batch=None) -> list:
    """The distinct layers of ``model`` (those named in ``names``, when given),
    at batch ``batch`` when given."""
    from cso.models import MODELS

    layers = [layer for layer in MODELS[model]() if not names or layer.name in names]
    if names:
        missing = sorted(set(names) - {layer.name for layer in layers})
        if missing:
            raise SystemExit(f"no such layer in {model}: {', '.join(missing)}")
    return [layer.with_batch(batch) for layer in layers] if batch else layers


def depthwise_layers(model: str, names=None) -> list:
    """The distinct depthwise layers of ``model`` (those named in ``names``,
    when given); exits with a message when there are none."""
    layers = [layer for layer in model_layers(model, names) if layer.depthwise]
    if not layers:
        raise SystemExit(f"{model} has no depthwise layer among those named")
    return layers


def depthwise_setting(args) -> tuple:
    """``(layers, peak, torch_run)`` for the depthwise experiments timed as
    the benchmark times them: the model's depthwise layers (``--layers``),
    the FMA peak of ``--threads`` cores in GFLOP/s and torch's program
    (None when torch is not installed)."""
    import cso
    from cso.measure import torch_peer
    from cso.microkernels.peak import fma_peak_gflops

    layers = depthwise_layers(args.model, args.layers)
    hardware = cso.detect_hardware()
    peak = fma_peak_gflops("float32", max(1, hardware.vector_bytes // 4)) * args.threads
    return layers, peak, torch_peer(args.threads)


def checked_operands(layer, threads: int) -> tuple:
    """``(x, w, y)``: seeded float32 operands of ``layer`` and
    ``cso.conv2d``'s result on ``threads`` threads, checked against the
    float64 reference (a wrong result ends the script naming the layer)."""
    import numpy as np

    import cso

    rng = np.random.default_rng(0)
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    params = layer.params
    result = cso.conv2d(x, w, threads=threads, **params)
    exact = cso.reference.conv2d(x.astype(np.float64), w.astype(np.float64), **params)
    # float32 products of R*S taps, each rounded: a generous bound.
    taps = layer.w_shape[2] * layer.w_shape[3]
    bound = 4 * taps * np.finfo(np.float32).eps * np.abs(x).max() * np.abs(w).max() * taps
    if np.max(np.abs(result - exact)) > bound:
        raise SystemExit(f"{layer.name}: cso's result is wrong")
    return x, w, result


def checked_programs(name: str, plans: dict, x, w, params: dict, exact) -> dict:
    """A program per plan of ``plans`` (``{key: plan}``): ``cso.conv2d`` of
    ``x`` by ``w`` with that plan into an output of its own, run once here
    and checked against ``exact`` (the float64 reference); a wrong result
    ends the script naming ``name`` and the plan's key."""
    import numpy as np

    import cso

    outputs = {key: np.empty(exact.shape, np.float32) for key in plans}
    programs = {
        key: (lambda k=key: cso.conv2d(x, w, plan=plans[k], out=outputs[k], **params))
        for key in plans
    }
    scale = max(1.0, float(np.max(np.abs(exact))))
    for key, program in programs.items():
        program()
        error = float(np.max(np.abs(outputs[key] - exact)))
        if not error < 1e-3 * scale:
            raise SystemExit(f"{name}: {key} is wrong (max error {error:.3g})")
    return programs


def nest_programs(plan, x, w, launches: dict) -> tuple:
    """``(programs, outputs)``: for each ``{name: launch}`` of ``plan`` (the
    same plan through other loop modules, ``cso.launch.launch_for(...,
    module=...)``), a program running that loop nest alone on ``x`` and
    ``w``, no epilogue, into an output of its own, run once here; and
    ``{name: output}``, for the caller to compare."""
    import numpy as np

    from cso import executor
    from cso.outputs import new_output

    filters = executor.filter_operands(w, None, plan)
    programs, outputs = {}, {}
    for name, launch in launches.items():
        y = new_output(plan.geometry.output_shape, np.dtype(plan.dtype))
        arguments = executor.loop_arguments(launch, x, filters, y)
        programs[name] = lambda launch=launch, arguments=arguments: executor.launch_nest(
            plan, launch, arguments
        )
        programs[name]()
        outputs[name] = y
    return programs, outputs


def variant_programs(layer, plan, x, w, shipped: str, variant: str, module) -> dict:
    """Programs running ``plan``'s nest alone (:func:`nest_programs`) on ``x``
    and ``w``: as shipped, named ``shipped``, and through the loop module
    ``module`` (a build of the same plan), named ``variant``; their outputs
    checked bit for bit alike."""
    import numpy as np

    from cso.launch import launch_for

    launches = {
        shipped: launch_for(plan, False),
        variant: launch_for(plan, False, module=module),
    }
    programs, outputs = nest_programs(plan, x, w, launches)
    if not np.array_equal(outputs[shipped], outputs[variant]):
        raise SystemExit(f"{layer.name}: the {variant} nest's output differs from the {shipped}")
    return programs


def row_variant_programs(layer, plan, rng, shipped: str, variant: str, **options) -> dict:
    """:func:`variant_programs` of a row plan on random operands of
    ``layer``'s shapes drawn from ``rng``, the variant the row module built
    with ``options`` (:func:`cso.launch.rows_module_for`)."""
    import numpy as np

    from cso.launch import rows_module_for

    x = rng.standard_normal(layer.x_shape).astype(np.float32)
    w = rng.standard_normal(layer.w_shape).astype(np.float32)
    module = rows_module_for(plan, **options)
    return variant_programs(layer, plan, x, w, shipped, variant, module)


def report_paired(layer, plan, samples: dict, totals: dict, reference: str, other: str,
                  labels: dict) -> None:  # fmt: skip
    """Print ``layer``'s line from :func:`cso.measure.round_times`' ``samples``:
    both programs' best times (named by ``labels``) and the median of the
    paired rounds' ratios ``t_reference / t_other``; add each one's best
    time, times the layer's count, to ``totals``."""
    from cso.measure import kernel_name, paired_ratios

    speedup = paired_ratios(samples, reference)[other]
    for name in (reference, other):
        totals[name] = totals.get(name, 0.0) + min(samples[name]) * layer.count
    print(
        f"{layer.name:<22} {kernel_name(plan):>9}"
        f"  {labels[reference]} {min(samples[reference]) * 1e6:7.1f} us"
        f"  {labels[other]} {min(samples[other]) * 1e6:7.1f} us"
        f"  speedup (paired) {speedup:.3f}  x{layer.count}"
    )


def report_paired_totals(totals: dict, reference: str, other: str, labels: dict) -> None:
    """Print the totals :func:`report_paired` added up, and their ratio."""
    if totals.get(other):
        print(
            f"total: {labels[reference]} {totals[reference] * 1e6:.1f} us, {labels[other]} "
            f"{totals[other] * 1e6:.1f} us, {labels[reference]} / {labels[other]} "
            f"{totals[reference] / totals[other]:.3f}"
        )


def row_plan_layers(threads: int, algorithms=None) -> list:
    """``[(layer, plan)]``: each distinct depthwise layer of EfficientNet-B0
    and MobileNetV2 to which the analysis gives the row plan at ``threads``
    (or any plan of ``algorithms``, a collection of ``Algorithm``)."""
    import cso
    from cso.analysis.choices import Algorithm
    from cso.models import efficientnet_b0, mobilenetv2_100

    wanted = (Algorithm.DEPTHWISE_ROWS,) if algorithms is None else tuple(algorithms)
    chosen, seen = [], set()
    for layer in efficientnet_b0() + mobilenetv2_100():
        if not layer.depthwise or layer.name in seen:
            continue
        seen.add(layer.name)
        plan = cso.plan_conv2d(layer.x_shape, layer.w_shape, threads=threads, **layer.params)
        if plan.algorithm in wanted:
            chosen.append((layer, plan))
    return chosen


def build_c(source: str, output: str, shared: bool = False) -> tuple:
    """``(path, None)``: ``source`` (a file in this folder) built by ``gcc -O3
    -march=native`` into ``output`` in a new temporary folder (a shared
    library when ``shared``); ``(None, reason)`` when there is no gcc or the
    build fails (on a machine without the instructions the C uses)."""
    import pathlib
    import shutil
    import subprocess
    import tempfile

    compiler = shutil.which("gcc")
    if compiler is None:
        return None, "no gcc on PATH"
    here = pathlib.Path(__file__).resolve().parent
    built = pathlib.Path(tempfile.mkdtemp()) / output
    flags = ["-shared", "-fPIC"] if shared else []
    build = subprocess.run(
        [compiler, "-O3", "-march=native", *flags, str(here / source), "-o", str(built)],
        capture_output=True,
        text=True,
    )
    if build.returncode:
        return None, f"gcc failed: {build.stderr.strip()[:200]}"
    return built, None
