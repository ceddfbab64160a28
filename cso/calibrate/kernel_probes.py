"""Probes of the micro-kernels alone: their rate from L1, what an L2 stream
adds, the write-back of a filter-vectorised tile, the line reloads of
filter rows that overflow an L1 set, and the tap kernel's fixed cost.

Each probe calls one generated kernel (:mod:`cso.microkernels`) in a
jitted loop over operands laid out as the loop nests lay them out
(:mod:`cso.macrokernel.loops`: packed panels ``[depth][Nf]`` and
``[depth][Nwin]``, output rows ``out_stride`` apart), so the rates are the
kernels' own, without the loop nest around them.
"""

from __future__ import annotations

import functools
from statistics import median

import numpy as np
from numba import njit

from ..analysis import tiles
from ..analysis.choices import VectorOperand
from ..analysis.shape_tables import kernel_shape_key
from ..microkernels.outer_product import build_outer_product_kernel
from ..microkernels.taps import build_tap_kernel
from ..packing.filters import aligned_empty
from .timing import best_seconds, calls_for, slope_and_intercept

# A 56x56 output plane: the output rows of a tile are this far apart, as in
# a mid-sized layer, so the write-back touches as many lines as it does there.
OUT_STRIDE = 56 * 56
# An extra time under this share of the time it is measured against is the
# timings' noise, taken as 0: on a shared Sapphire Rapids Xeon a kernel's
# best-of time moved by up to 5% between rounds, and the L2 stream's extra
# (0 to 3% of the kernel's time) and the L1 spill's (0 in four calibrations,
# 3.5% in a fifth) changed 9-18 and 31 of ResNet-50's and VGG-16's 70 plans.
RESOLUTION = 0.05
# Multiply-add steps of one kernel call in the rate probes (each operand's
# tile, 256 steps deep, stays within the L1).
RESIDENT_DEPTH = 256


def planner_shapes(vector_bytes: int, vector_registers: int) -> list:
    """``[(Nf, Nwin, operand)]``: the float32 shapes the planner offers."""
    shapes = [
        (nf, nwin, VectorOperand.WINDOWS.value)
        for nf, nwin in tiles.register_blocks(vector_bytes, vector_registers, 4)
    ]
    shapes += [
        (nf, nwin, VectorOperand.FILTERS.value)
        for nf, nwin in tiles.filter_vector_blocks(vector_bytes, vector_registers, 4)
    ]
    return shapes


@functools.lru_cache(maxsize=None)
def _runner(nf, nwin, operand, lanes):
    """A jitted loop calling one float32 kernel ``calls`` times, cycling over
    ``filter_tiles`` filter panels, ``input_tiles`` input panels and
    ``out_tiles`` output tiles (memoised: one compilation per shape)."""
    kernel = build_outer_product_kernel(nf, nwin, "float32", lanes, operand)

    @njit(nogil=True)
    def run(depth, filters, f_k, f_i, filter_tiles, filter_step, inputs, input_tiles,
            out, out_tiles, out_stride, bias, calls):  # fmt: skip
        for call in range(calls):
            kernel(
                depth,
                filters,
                (call % filter_tiles) * filter_step,
                f_k,
                f_i,
                inputs,
                (call % input_tiles) * depth * nwin,
                nwin,
                out,
                (call % out_tiles) * nwin,
                out_stride,
                bias,
                0,
                False,
                False,
                out,
                0,
                0,
                False,
            )

    return run


def _operands(size):
    array = aligned_empty(size, np.float32)
    array[:] = 1.0 / size
    return array


def kernel_seconds(
    nf,
    nwin,
    operand,
    lanes,
    depth,
    *,
    filter_tiles=1,
    input_tiles=1,
    out_tiles=1,
    filter_row_stride=None,
    repeats=5,
    budget=0.02,
) -> float:
    """Seconds per call of one kernel, operands cycling over the tiles given.

    ``filter_row_stride`` reads the filters as the KCRS array in place (rows
    that far apart, one element a step) instead of a packed panel.
    """
    run = _runner(nf, nwin, operand, lanes)
    if filter_row_stride is None:
        f_k, f_i, filter_step = nf, 1, depth * nf
        filters = _operands(filter_tiles * depth * nf)
    else:
        f_k, f_i, filter_step = 1, filter_row_stride, nf * filter_row_stride
        filters = _operands(filter_tiles * nf * filter_row_stride + depth)
    inputs = _operands(input_tiles * depth * nwin)
    out = _operands(max(nf, nwin) * OUT_STRIDE + out_tiles * nwin)
    bias = np.zeros(max(nf, nwin), np.float32)
    args = (depth, filters, f_k, f_i, filter_tiles, filter_step, inputs, input_tiles, out,
            out_tiles, OUT_STRIDE, bias)  # fmt: skip
    run(*args, 1)
    probe = best_seconds(lambda: run(*args, 10), 2) / 10
    calls = calls_for(probe, budget)
    return best_seconds(lambda: run(*args, calls), repeats) / calls


def stream_seconds_per_byte(nf, nwin, operand, lanes, footprint, resident, depth=RESIDENT_DEPTH,
                            repeats=5) -> float:  # fmt: skip
    """Extra seconds per streamed byte when the streamed operand cycles through
    panels filling ``footprint`` bytes rather than one L1-resident panel
    (whose call took ``resident`` seconds, at the same ``depth``); 0 under
    :data:`RESOLUTION` of ``resident``.

    The streamed operand is the one a schedule streams past the stationary
    tile: the input panels for a window-vectorised kernel (WS-like), the
    filter panels for a filter-vectorised one (IS-like).
    """
    streams_inputs = operand == VectorOperand.WINDOWS.value
    width = nwin if streams_inputs else nf
    panel = depth * width * 4
    count = max(2, footprint // panel)
    stream = {"input_tiles": count} if streams_inputs else {"filter_tiles": count}
    streamed = kernel_seconds(nf, nwin, operand, lanes, depth, repeats=repeats, **stream)
    if streamed - resident < RESOLUTION * resident:
        return 0.0
    return (streamed - resident) / panel


def transposed_store_seconds(shapes, lanes, repeats=5) -> float:
    """Per output element: a filter-vectorised kernel's call intercept less a
    window-vectorised one's, over their tiles' elements (0 when there is no
    filter-vectorised shape).

    Each intercept is fitted to the call's time at depths 8 to 64, its
    output tile cycling over 64 tiles; the eight calls are timed in
    :func:`interleaved_seconds`' rounds (``3 * repeats``).  Timed one after
    the other (best of ``repeats`` each), five runs in a row on a shared Xeon
    read 0.083-0.109 ns; interleaved, 0.087-0.092 ns.  Between calibrations
    minutes apart the machine's state moves it more (41-59 units over
    twelve), and that alone changed 7 of ResNet-50's and VGG-16's 140 plans
    between two of them.
    """
    windows = [s for s in shapes if s[2] == VectorOperand.WINDOWS.value]
    filters = [s for s in shapes if s[2] == VectorOperand.FILTERS.value]
    if not filters or not windows:
        return 0.0
    transposed = filters[0]
    # The window-vectorised shape with the closest tile size.
    plain = min(windows, key=lambda s: abs(s[0] * s[1] - transposed[0] * transposed[1]))
    depths = (8, 16, 32, 64)
    runs = {
        (shape, depth): (*shape, dict(depth=depth, out_tiles=64))
        for shape in (transposed, plain)
        for depth in depths
    }
    best = interleaved_seconds(runs, lanes, 3 * repeats)

    def intercept_per_element(shape):
        times = [best[(shape, depth)] for depth in depths]
        return max(0.0, slope_and_intercept(depths, times)[1]) / (shape[0] * shape[1])

    return max(0.0, intercept_per_element(transposed) - intercept_per_element(plain))


def l1_spill_seconds_per_byte(shapes, lanes, l1_bytes, l2_bytes, repeats=5):
    """Per byte of filters: a window-vectorised kernel whose filter and input
    panels together are twice L1, both cycling over panels that fill half
    of L2, less four calls of the same kernel at a quarter of the depth
    (operands within half of L1: the same multiply-adds from L1); 0 under
    :data:`RESOLUTION` of the latter.

    The two are timed beside each other, in interleaved rounds (the short
    calls' three extra call overheads, some 1% here, count against the
    spill).  Against the L1 rate measured earlier in the calibration, the
    difference moved with the machine's state: on a shared Xeon two
    calibrations minutes apart read 0 and 4.3 units (8.5% of the kernel),
    which moved the channel tiles of 40 of ResNet-50's and VGG-16's 70
    plans; timed beside its reference it read -1.5% to +1.2% in eight runs.
    """
    nf, nwin, operand = next(s for s in shapes if s[2] == VectorOperand.WINDOWS.value)
    depth = 2 * l1_bytes // ((nf + nwin) * 4)
    tiles_in_l2 = max(2, l2_bytes // 2 // ((nf + nwin) * 4 * depth))
    best = interleaved_seconds(
        {
            "spilled": (nf, nwin, operand, dict(
                depth=depth, filter_tiles=tiles_in_l2, input_tiles=tiles_in_l2
            )),
            "resident": (nf, nwin, operand, dict(depth=depth // 4)),
        },
        lanes,
        repeats,
    )  # fmt: skip
    resident = 4 * best["resident"]
    if best["spilled"] - resident < RESOLUTION * resident:
        return 0.0
    return (best["spilled"] - resident) / (depth * nf * 4)


def l2_line_reload_seconds(shape, lanes, l1_bytes, l1_ways, line_bytes, repeats=5):
    """Seconds per filter read whose line was evicted by its own rows: the
    window-vectorised kernel ``shape`` (``(Nf, Nwin)``,
    :func:`~cso.analysis.tiles.conflict_probe_shape`, the shape the cost
    model scales this figure from) reading its ``Nf`` filter rows in place,
    rows one L1 way apart (all in one set) against one way and a line apart.

    Returns None when ``shape`` is None (no offered shape has more rows than
    the L1 has ways: no plan can then conflict, the figure is not needed).
    """
    if shape is None:
        return None
    nf, nwin = shape
    operand = VectorOperand.WINDOWS.value
    way = l1_bytes // l1_ways // 4  # elements: one way of the L1 apart maps to the same set
    depth = way
    aliased = kernel_seconds(nf, nwin, operand, lanes, depth, filter_row_stride=way,
                             repeats=repeats)  # fmt: skip
    spread = kernel_seconds(nf, nwin, operand, lanes, depth, repeats=repeats,
                            filter_row_stride=way + line_bytes // 4)  # fmt: skip
    return max(0.0, aliased - spread) / (depth * nf)


@functools.lru_cache(maxsize=None)
def _tap_runner(vectors, lanes):
    # The one-row kernel: R = rows = 1, every tap a column.
    kernel = build_tap_kernel(1, 1, 1, 1, vectors, "float32", lanes)

    @njit(nogil=True)
    def run(columns, weights, offsets, inputs, width, out, segment, calls, residual):
        zero_bias = np.zeros(1, np.float32)
        for call in range(calls):
            kernel(columns, weights, 0, 0, offsets, inputs, 0, width, out, 0, segment, 0,
                   segment, zero_bias, 0, 0, residual, 0, 0, False)  # fmt: skip

    return run


def tap_call_seconds_by_columns(lanes, columns, vectors=4, repeats=5):
    """Seconds of one call of the one-row depthwise tap kernel on L1-resident
    rows, for each count of column taps in ``columns``."""
    run = _tap_runner(vectors, lanes)
    segment = vectors * lanes
    width = segment + 32
    seconds = []
    for count in columns:
        # Column offsets, then the weights' (one row: each tap's own).
        offsets = np.array([t % 24 for t in range(count)] + list(range(count)), dtype=np.intp)
        weights, inputs = _operands(count), _operands(width)
        out, residual = _operands(segment), _operands(segment)
        args = (count, weights, offsets, inputs, width, out, segment)
        run(*args, 1, residual)
        calls = 20000
        seconds.append(best_seconds(lambda: run(*args, calls, residual), repeats) / calls)
    return seconds


def tap_seconds(lanes, vectors=4, repeats=5) -> tuple:
    """``(fixed seconds of a call, seconds per input vector loaded)`` of the
    one-row tap kernel, which loads one vector per FMA: the intercept and
    the slope (per vector) of its time against its column taps (1 to 18)."""
    columns = (1, 3, 9, 18)
    seconds = tap_call_seconds_by_columns(lanes, columns, vectors=vectors, repeats=repeats)
    slope, intercept = slope_and_intercept(columns, seconds)
    return max(0.0, intercept), max(0.0, slope / vectors)


def interleaved_seconds(runs: dict, lanes, rounds) -> dict:
    """``{name: seconds per call}`` of ``runs``, ``{name: (Nf, Nwin,
    operand, settings)}`` with ``settings`` :func:`kernel_seconds`'
    keywords: ``rounds`` rounds, each timing every run once (best of one),
    in an order that rotates, the shortest of each run's kept."""
    names = list(runs)
    best = {}
    for round_index in range(rounds):
        start = round_index % len(names)
        for name in names[start:] + names[:start]:
            nf, nwin, operand, settings = runs[name]
            seconds = kernel_seconds(nf, nwin, operand, lanes, repeats=1, **settings)
            best[name] = min(seconds, best.get(name, seconds))
    return best


def resident_seconds(shapes, lanes, depth=RESIDENT_DEPTH, rounds=15) -> dict:
    """``{(Nf, Nwin, operand): seconds per call}`` with every operand in L1,
    every shape timed in :func:`interleaved_seconds`' rounds."""
    runs = {shape: (*shape, dict(depth=depth)) for shape in shapes}
    return interleaved_seconds(runs, lanes, rounds)


def call_flops(nf, nwin, seconds, depth=RESIDENT_DEPTH) -> float:
    """FLOP/s of an ``Nf x Nwin`` kernel call of ``depth`` steps that took ``seconds``."""
    return 2 * nf * nwin * depth / seconds


def kernel_rates(shapes, lanes, l1_bytes, l2_bytes, repeats=5, depth=RESIDENT_DEPTH) -> dict:
    """``{"NfxNwin[w|f]": (FLOP/s from L1, extra s/byte streaming from L2,
    extra s/byte streaming from L3)}``: the streams cycle over panels filling
    ``min(L2/2, 4 L1)`` (in L2) and ``4 L2`` (beyond it), each against the
    same L1-resident call.

    The rates from L1 are timed in interleaved rounds, every shape once a
    round, the best of each kept: on a shared Xeon one shape timed alone
    (best of 15) moved from 84% to 94% of the peak between calibrations,
    as the machine's other tenants came and went, and with it the plans
    that shape's own mac cost decides.
    """
    resident_of = resident_seconds(shapes, lanes, depth, rounds=3 * repeats)
    rates = {}
    for nf, nwin, operand in shapes:
        resident = resident_of[(nf, nwin, operand)]
        rates[kernel_shape_key(nf, nwin, operand)] = (
            call_flops(nf, nwin, resident, depth),
            stream_seconds_per_byte(
                nf, nwin, operand, lanes, min(l2_bytes // 2, 4 * l1_bytes), resident, depth,
                repeats,
            ),
            stream_seconds_per_byte(
                nf, nwin, operand, lanes, 4 * l2_bytes, resident, depth, repeats
            ),
        )  # fmt: skip
    return rates


def summary(rates: dict) -> tuple:
    """``(median FLOP/s from L1, least extra s/byte from L2)`` over the shapes.

    The L2 figure is what every shape pays for its stream from L2, the
    least of theirs: a shape's own extra beyond it is in its time in the
    loop nest (:func:`cso.calibrate.loop_probes.loop_shape_seconds`, its own
    mac cost), which streams from L2 as layers do.  The median jumped
    between 0 and one shape's figure from one calibration to the next (0
    and 0.6 ps/byte on a Xeon, where most shapes' extra is under
    :data:`RESOLUTION`), and the mean (1.1-1.5 ps/byte there) charged the
    8 x 48 kernel, whose own extra was 0, for the 16 x 16's: the model then
    took 32 x 14 with filters packed per call on ResNet-50's 56 x 56 layers,
    which ran 1.04-1.10x slower than 8 x 48.
    """
    return median([r[0] for r in rates.values()]), min(r[1] for r in rates.values())
