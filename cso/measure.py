"""Measuring cso: timing in interleaved rounds, plans run as a call runs
them, variants of the loop nest, and the peers it is compared with.

The supported API for the benchmark (:mod:`cso.bench`), the autotuner
(:mod:`cso.tune`) and ``experiments/``.  Nothing here is on the path of
:func:`cso.conv2d`: a variant is a :class:`~cso.macrokernel.specialise.LoopPatch`
of the loop module, run through the executor's own steps.
"""

from __future__ import annotations

import random
import time
from statistics import median

import numpy as np

from . import executor
from . import launch as launches
from .analysis.choices import TAP_ALGORITHMS, Algorithm
from .analysis.plan import Plan
from .macrokernel.specialise import LoopPatch

# The measurement variants of the loop nests: the same nests with a stage
# replaced by a no-op (the time of a stage is the difference between the
# full program and the one without it), or with one choice undone.
VARIANTS = {
    "no-kernel": LoopPatch(
        "no-kernel", "\n@njit(nogil=True)\ndef microkernel(*args):\n    return\n"
    ),
    # The panels then hold what earlier calls packed into the kept workspace
    # (zeros at first): finite operands, see cso.workspace.
    "no-pack": LoopPatch(
        "no-pack",
        "\n@njit(nogil=True)\ndef pack_window_tiles(*args):\n    return\n",
    ),
    # The micro-kernel without its software prefetch.
    "no-prefetch": LoopPatch("no-prefetch", "", (("prefetch_distance", 0),)),
    # A filter-vectorised tile written back one element at a time.
    "element-stores": LoopPatch("element-stores", "", (("transposed_store", False),)),
    # 1x1 panels packed tile by tile, as other layers are, not channel by channel.
    "tile-by-tile": LoopPatch(
        "tile-by-tile",
        "\nfrom cso.macrokernel.input_tiles import pack_window_tile\n"
        '\n@njit(nogil=True, inline="always")\n'
        "def pack_window_tiles(operands, b, image, group, c0, channels, first_tile, tiles, size,\n"
        "                      vector):\n"
        "    for t in range(tiles):\n"
        "        start = (first_tile + t) * b.windows_per_tile\n"
        "        pack_window_tile(\n"
        "            operands, b, image, group, c0, channels, start, t * size, vector\n"
        "        )\n",
    ),
    # The per-tile helper and the packing step called as functions rather than
    # inlined into the loops.
    "outlined": LoopPatch(
        "outlined",
        "\n_tile = njit(nogil=True)(_tile.py_func)\n"
        "pack_window_tiles = njit(nogil=True)(pack_window_tiles.py_func)\n",
    ),
}
# The micro-kernel handed arrays, not their data addresses: each tile then
# picks among arrays, and Numba updates their reference counts every tile.
VARIANTS["array-operands"] = LoopPatch(
    "array-operands",
    '\n@njit(nogil=True, inline="always")\n'
    "def _addresses(operands):\n"
    "    return operands[0], operands[1], operands[2], operands[4], operands[5], operands[6]\n",
)
VARIANTS["skeleton"] = LoopPatch(
    "skeleton", VARIANTS["no-kernel"].source + VARIANTS["no-pack"].source
)


def _no_ops(*names) -> str:
    """Source rebinding each of ``names`` to a function that does nothing."""
    return "".join(f"\n@njit(nogil=True)\ndef {name}(*args):\n    return\n" for name in names)


# The tap nest's (depthwise and small grouped) stages: its kernel, and the
# packing of each group's channels (cso.macrokernel.depthwise).
TAP_VARIANTS = {
    "no-kernel": LoopPatch("no-kernel", _no_ops("tap_kernel")),
    "no-pack": LoopPatch("no-pack", _no_ops("pack_channel_phases", "pack_channel_rows")),
    "skeleton": LoopPatch(
        "skeleton", _no_ops("tap_kernel", "pack_channel_phases", "pack_channel_rows")
    ),
}
# The lane nest's stages (cso.macrokernel.lanes): its kernel, the transposes
# laying each block's filters and input planes out as pixel vectors
# (lane_pack), and those writing the pixels back to the output planes
# (lane_unpack).
LANE_VARIANTS = {
    "no-kernel": LoopPatch("no-kernel", _no_ops("lane_tap_kernel")),
    "no-pack": LoopPatch("no-pack", _no_ops("lane_pack")),
    "no-unpack": LoopPatch("no-unpack", _no_ops("lane_unpack")),
    "skeleton": LoopPatch("skeleton", _no_ops("lane_tap_kernel", "lane_pack", "lane_unpack")),
}


# The plane nest's stages (cso.macrokernel.planes): its kernels only; it
# packs nothing, so its skeleton is the no-kernel variant.
PLANE_VARIANTS = {
    "no-kernel": LoopPatch(
        "no-kernel",
        _no_ops("plane_tap_kernel", "plane_tap_kernel_edges", "plane_tap_kernel_checked"),
    ),
}


# The row nest's stages (cso.macrokernel.rows): its kernel only, as the plane nest's.
ROW_VARIANTS = {
    "no-kernel": LoopPatch("no-kernel", _no_ops("row_tap_kernel", "row_tap_kernel_checked")),
}


# The Winograd nest's stages (cso.macrokernel.winograd): its products'
# kernel, the input and filter transforms (as "packing") and the output
# transform (as "unpacking").
WINOGRAD_VARIANTS = {
    "no-kernel": LoopPatch("no-kernel", _no_ops("microkernel")),
    "no-pack": LoopPatch("no-pack", _no_ops("input_tiles", "filter_tiles")),
    "no-unpack": LoopPatch("no-unpack", _no_ops("output_tiles")),
    "skeleton": LoopPatch(
        "skeleton", _no_ops("microkernel", "input_tiles", "filter_tiles", "output_tiles")
    ),
}


def variants_for(plan: Plan) -> dict:
    """The measurement variants of ``plan``'s loop nest, by name:
    :data:`VARIANTS` (dense), :data:`TAP_VARIANTS`, :data:`LANE_VARIANTS`,
    :data:`PLANE_VARIANTS`, :data:`ROW_VARIANTS` or :data:`WINOGRAD_VARIANTS`."""
    if plan.algorithm == Algorithm.WINOGRAD:
        return WINOGRAD_VARIANTS
    if plan.algorithm == Algorithm.DEPTHWISE_PLANES:
        return PLANE_VARIANTS
    if plan.algorithm == Algorithm.DEPTHWISE_ROWS:
        return ROW_VARIANTS
    if plan.algorithm == Algorithm.DEPTHWISE_LANES:
        return LANE_VARIANTS
    if plan.algorithm in TAP_ALGORITHMS:
        return TAP_VARIANTS
    return VARIANTS


def best_times(programs, rounds=5, min_seconds=0.0):
    """Best time of each program over interleaved rounds (at least ``rounds``,
    more until ``min_seconds`` have passed, 50 at most).

    Each round runs the programs in a fresh order (a shuffle, seeded so
    that runs repeat), so that no program always meets the caches as one
    other program left them.  The order used to rotate, which keeps every
    program's predecessor the same: in the benchmark ``cso.conv2d`` per call
    always followed torch and the packed-filters call always followed
    ``cso.conv2d``, which left it the same input warm and its workspace in
    cache (on a Xeon, ``dw 3x3 576 @14``: per call 66 and packed 52
    microseconds that way, 50 and 47 timed without the peers).
    """
    return {name: min(times) for name, times in round_times(programs, rounds, min_seconds).items()}


def fast_quarter_times(programs, rounds=5, min_seconds=0.0):
    """Each program's mean time over its fastest quarter of interleaved
    rounds (as in :func:`best_times`, and at least 4).

    For a difference of two programs' times that is a few percent of
    either: the best of each is one lucky round apiece, and the difference
    of two such moves by as much as itself.  On a shared Xeon, a filter
    read in place by the 8 x 48 kernel (two 1.5 ms programs 2% apart),
    sampled 16 times: the difference of the best rounds 10.1 ps a read
    (standard deviation 6.4), of the fastest quarters' means 9.0 (2.5).
    """
    samples = round_times(programs, max(4, rounds), min_seconds)
    result = {}
    for name, times in samples.items():
        quarter = max(1, len(times) // 4)
        result[name] = sum(sorted(times)[:quarter]) / quarter
    return result


def paired_ratios(samples, reference) -> dict:
    """``{name: median over rounds of t_reference / t_name}`` from
    :func:`round_times`' samples: how many times faster than ``reference``
    each program ran, each ratio of two timings taken within one round.

    On a shared machine whose speed drifts by tens of percent from one
    second to the next, the ratio of two best times is that of two lucky
    rounds taken at other moments; within a round both programs meet much
    the same state.  On a 2-core AMD EPYC (Zen 3), two packing builds whose
    median ratio over paired rounds came out 0.91-1.04 gave ratios of their
    best times from 0.47 to 3.5 in rounds a minute apart.
    """
    base = samples[reference]
    return {
        name: median([b / t for b, t in zip(base, times)]) for name, times in samples.items()
    }


def paired_difference(programs, first, second, rounds=5, min_seconds=0.0) -> float:
    """``t_first - t_second`` as the machine runs at its best: the median over
    interleaved rounds (:func:`round_times`) of ``t_first / t_second - 1``,
    the two timed in the same round, times ``second``'s best round.

    A difference of a few percent of either time, which the best rounds of
    each (taken at other moments of a drifting machine) move by as much as
    itself; a ratio within a round is the same whether the round ran fast or
    slow, and the best round scales it as :func:`best_times` would."""
    samples = round_times(programs, rounds, min_seconds)
    excess = median([a / b - 1.0 for a, b in zip(samples[first], samples[second])])
    return excess * min(samples[second])


def round_times(programs, rounds=5, min_seconds=0.0) -> dict:
    """``{name: [seconds of each round]}``: at least ``rounds`` rounds, more
    until ``min_seconds`` have passed, 50 at most; each round runs every
    program once, in a fresh seeded shuffle (:func:`best_times`)."""
    samples = {name: [] for name in programs}
    for _, name, seconds in timed_rounds(programs, rounds, min_seconds):
        samples[name].append(seconds)
    return samples


def timed_rounds(programs, rounds=5, min_seconds=0.0):
    """Yield ``(round, name, seconds)`` for every call :func:`round_times`
    makes, in the order it makes them: the rounds' seeded shuffles, for a
    measurement that needs to know which program ran before which."""
    order = list(programs)
    shuffle = random.Random(0).shuffle
    started = time.perf_counter()
    done = 0
    while done < rounds or (time.perf_counter() - started < min_seconds and done < 50):
        shuffle(order)
        for name in order:
            start = time.perf_counter()
            programs[name]()
            yield done, name, time.perf_counter() - start
        done += 1


def plan_program(plan: Plan, x, w, bias=None, *, variant=None, prepacked=None):
    """A callable that computes ``plan``'s convolution of ``x`` by ``w`` as
    :func:`cso.conv2d` does (filters prepared in every call), into one
    output array it returns.

    Parameters
    ----------
    plan : Plan
    x, w, bias : numpy.ndarray
        The operands (``bias`` may be None).
    variant : str, optional
        A name of the plan's family's variants (:func:`variants_for`): the
        loop nest with that change (its results are meaningless for the
        ``no-*`` and ``skeleton`` ones).
    prepacked : PackedFilters, optional
        Filters packed ahead of time for ``plan`` (:func:`cso.pack_filters`):
        read as a call with packed filters reads them (``w`` and ``bias``
        are then ignored).
    """
    known = sorted(set(VARIANTS) | set(TAP_VARIANTS) | set(LANE_VARIANTS))
    if variant is not None and variant not in known:
        raise ValueError(f"variant must be one of {known} or None, got {variant!r}")
    variants = variants_for(plan)
    if variant is not None and variant not in variants:
        raise ValueError(
            f"variant must be one of {sorted(variants)} (those of a {plan.algorithm.value} "
            f"plan's loop nest) or None, got {variant!r}"
        )
    y = np.empty(plan.geometry.output_shape, np.dtype(plan.dtype))
    operands = None
    if prepacked is not None:
        operands = executor.prepacked_operands(prepacked.panels, prepacked.bias, plan)
    # Which layout the loop nest reads the filters in: as the operands say.
    # (A filter-vectorised plan that packs its tiles in the nest reads KCRS.)
    filters_packed = (
        operands.packed if operands is not None else executor.packs_panels_up_front(plan)
    )
    launch = None
    if variant is not None:
        module = launches.loop_module_for(plan, variants[variant])
        launch = launches.launch_for(plan, filters_packed, module)

    if operands is not None:

        def program():
            return executor.run(plan, x, operands, y, launch)

    else:

        def program():
            return executor.run(plan, x, executor.filter_operands(w, bias, plan), y, launch)

    return program


def filter_program(plan: Plan, w, bias=None):
    """A callable that prepares ``w`` and ``bias`` for ``plan`` as a call does."""
    return lambda: executor.filter_operands(w, bias, plan)


def stage_times(plan: Plan, x, w, rounds=5) -> dict:
    """Where one call's time goes, by difference between variants of the loop nest.

    ``total``: the call's loop nest with its filter preparation.  ``filters``:
    that preparation (packing the filters for a filter-vectorised plan, or
    a group's tile when it has fewer than ``Nf`` filters, and the bias).
    ``kernel``: total minus the same program with a no-op micro-kernel.  A
    plan that packs its filters in the loop nest
    (``Plan.packs_filters_in_nest``) has no filter preparation: that
    packing is in ``rest``.
    ``input packing``: total minus the program that never packs (the lane
    nest: the transposes laying filters and input out as pixel vectors).
    ``output unpacking`` (the lane and Winograd nests): total minus the
    program that never transposes its pixels back to the output planes (the
    lane nest) or never runs the output transform (Winograd, whose input
    packing is its input and filter transforms).  The plane and
    row nests pack nothing: they have neither, and their skeleton is the
    no-kernel program.  ``rest``: the
    skeleton (none of those stages) less the filter preparation: the loops,
    edge-tile copies, thread launch and Python around them.  Timing noise
    can make a difference slightly negative; it is reported as measured, so
    that the stages sum to ``total`` within that noise.
    """
    variants = variants_for(plan)
    packs, unpacks = "no-pack" in variants, "no-unpack" in variants
    stages = [("total", None), ("no-kernel", "no-kernel")]
    if packs:
        stages.append(("no-pack", "no-pack"))
    if unpacks:
        stages.append(("no-unpack", "no-unpack"))
    skeleton = "skeleton" if packs or unpacks else "no-kernel"
    if skeleton == "skeleton":
        stages.append(("skeleton", "skeleton"))
    programs = {
        name: plan_program(plan, x, w, variant=variant) for name, variant in stages
    }
    programs["filters"] = filter_program(plan, w)
    for program in programs.values():
        program()
    best = best_times(programs, rounds)
    times = {
        "total": best["total"],
        "kernel": best["total"] - best["no-kernel"],
    }
    if packs:
        times["input packing"] = best["total"] - best["no-pack"]
    if unpacks:
        times["output unpacking"] = best["total"] - best["no-unpack"]
    times["filters"] = best["filters"]
    times["rest"] = best[skeleton] - best["filters"]
    return times


# How a family other than the dense one names its kernel: ``row4x64`` is a
# row plan's block of 4 output rows of 64 outputs a call.
_FAMILY_PREFIXES = {
    Algorithm.DEPTHWISE: "tap",
    Algorithm.GROUPED: "grp",
    Algorithm.DEPTHWISE_LANES: "lane",
    Algorithm.DEPTHWISE_PLANES: "pln",
    Algorithm.DEPTHWISE_ROWS: "row",
}


def kernel_name(plan: Plan) -> str:
    """``14x32w``: ``Nf x Nwin``, w, f or r for the vectorised operand, and
    ``+`` when the batch is folded into the windows; for the depthwise and
    grouped families, the family and ``rows x outputs`` a call (``row4x64``,
    ``lane1x14``), then ``.fF`` for a tap plan of ``F > 1`` filters a call
    (``grp4x16.f4``); for Winograd, ``wg`` and its products' kernel
    (``wg8x48w``: tiles in the vectors)."""
    if plan.algorithm == Algorithm.WINOGRAD:
        return f"wg{plan.filters_per_tile}x{plan.windows_per_tile}w"
    prefix = _FAMILY_PREFIXES.get(plan.algorithm)
    if prefix is not None:
        filters = f".f{plan.filters_per_tile}" if plan.filters_per_tile > 1 else ""
        return f"{prefix}{plan.rows_per_call}x{plan.windows_per_tile}{filters}"
    folded = "+" if plan.batch_folded else ""
    return f"{plan.filters_per_tile}x{plan.windows_per_tile}{plan.vector_operand.value[0]}{folded}"


def im2col_gemm(x, w, stride, padding, groups=1):
    """The im2col + NumPy matmul peer (the BLAS NumPy links), in float32."""
    from .reference import conv2d as reference_conv2d

    return reference_conv2d(
        x, w, stride=stride, padding=padding, groups=groups, dtype=np.float32
    )


def torch_peer(threads):
    """torch's convolution on ``threads`` threads as ``run(x, w, stride,
    padding, groups=1)``, or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None

    def run(x, w, stride, padding, groups=1, _cache={}):
        key = (id(x), id(w))
        if key not in _cache:
            _cache.clear()
            _cache[key] = (torch.from_numpy(x), torch.from_numpy(w))
        tx, tw = _cache[key]
        # Numba's OpenMP threading layer sets the process-wide OpenMP thread
        # count when it launches a parallel region, and torch shares that
        # OpenMP runtime: without this, torch runs on every core after any
        # cso call, whatever it was told once.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        with torch.no_grad():
            return torch.nn.functional.conv2d(
                tx, tw, stride=stride, padding=padding, groups=groups
            )

    return run
