"""The row algorithm: depthwise convolutions on the planes as given, a block
of output rows at a time, any vertical stride and horizontal stride 1 or 2.

The plane plan (:mod:`.planes`) needs stride 1 and ``Q == W``, where one
shift maps every output pixel of a plane to its input; the lane plan
(:mod:`.lanes`) transposes every input pixel into channel vectors, a pass
that a large strided layer feels most (``dw 3x3/2 96 @112`` spent 64% of its
time there on the Xeon).  Here a kernel call computes a block of ``B``
output rows of ``U`` vectors of consecutive outputs ``q0 .. q0 + U*VL``
(:mod:`cso.microkernels.row_taps`): each input row of the block's window
on the plane is loaded once for every output row it serves (those off it
skipped), and for each column tap the vector of inputs ``(q0 +
l)*sw + s*dw - pad_left``.  At ``sw = 2`` that is every other element of
two loaded vectors, picked by one shuffle; taps whose offsets differ by one
share the two loads (the odd and the even elements).  Column masks zero
what falls off the row; they depend only on ``q0``, so they are made once
per plan for the calls of a row (:func:`mask_table`).  Nothing is packed.

On the Xeon, one thread, one-row calls against the lane plans: 1.3-1.75x
faster on the 3x3 stride-2 layers of 112, 56 and 28 wide inputs (``dw
3x3/2 96 @112`` 207 against 320-360 us, at its L3 roofline), level on ``dw
5x5/2 144 @56``, and 1.5-3x slower on 14x14 inputs, whose 7-wide rows fill
7 of 16 lanes.  Blocks of rows then ran 1.1-2x faster than one-row calls
on 3x3 layers (4 rows of 4 vectors on 112- and 56-wide planes, 7-14 rows
of 1-2 vectors on narrower ones); the lane plans stay ahead on 7-wide rows
and 5x5 filters.  The model weighs them (:func:`row_traffic`).

On an AMD EPYC (Zen 3, AVX2) the row plans lost to the lane plans on every
depthwise layer of MobileNetV2 and EfficientNet-B0, by their masks: AVX2's
masked loads and stores (``vmaskmov``) are slow there.  So the kernel now
loads whole vectors and zeroes what falls off the row by an and with the
mask as a lane vector (:func:`vector_mask_table`), and stores whole but for
a narrow row's last vector (:func:`tail_lanes`, plain pieces), in every
call whose whole loads stay in the input (the nest checks); then the row
plans ran 1.0-1.33x faster than the lane plans on 3x3 layers 28 or more
wide, one thread, and 1.1-1.6x slower on 5x5 and 14x14 ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from .choices import Algorithm
from .pricing import Traffic
from . import tap_rules
from .depthwise import even_split, job_traffic, per_channel, untiled_plan
from .tap_layout import rows_read
from .hardware import Hardware
from .plan import Plan
from .plane_shapes import (  # noqa: F401 (re-exported)
    filters_per_vector,
    MAX_ROW_STRIDE,
    is_row_depthwise,
    lane_vectors,
    max_block_rows,
    row_vectors_per_call,
)
from .ties import first_within


def load_groups(kernel_width: int, dilation_w: int, stride_w: int) -> dict:
    """``{e: [(s, phase), ...]}``: the column taps ``s`` whose inputs are the
    ``phase``-th of every ``stride_w`` elements of the ``stride_w`` vectors
    loaded from column offset ``e = s*dw - phase`` (``phase = s*dw mod
    stride_w``): one set of loads serves every tap it holds."""
    groups: dict = {}
    for s in range(kernel_width):
        offset = s * dilation_w
        groups.setdefault(offset - offset % stride_w, []).append((s, offset % stride_w))
    return groups


def entries_per_call(geometry: ConvGeometry, vectors: int, filters: int = 1) -> int:
    """Mask-table entries a call: ``F * U * (1 + groups * sw)``: each filter's
    (each vector's) store mask, then its load masks."""
    g = geometry
    groups = len(load_groups(g.kernel_width, g.dilation_w, g.stride_w))
    return filters * vectors * (1 + groups * g.stride_w)


def row_calls(out_width: int, span: int) -> list:
    """The ``q0`` of one output row's calls of ``span`` outputs: every
    ``span``, the last starting at ``Q - span`` so that it ends at the edge
    (overlapping the one before, computing some outputs twice, alike), or
    one call at 0 when the row is narrower than ``span`` (its stores masked)."""
    starts, q = [], 0
    while q < out_width:
        starts.append(min(q, out_width - span) if out_width >= span else q)
        q += span
    return starts


def mask_table(geometry: ConvGeometry, lanes: int, vectors: int, filters: int = 1) -> np.ndarray:
    """The row kernel's masks for every call of a row, as int32 bit sets of
    the lanes: for call ``j`` and vector ``u`` (outputs ``q = q0 + u*VL + l``),
    ``entries_per_call / U`` entries: the store mask ``q < Q``, then for each
    load group ``e`` (:func:`load_groups`) and half ``h < sw`` the lanes whose
    column ``q0*sw - pad_left + u*VL*sw + e + h*VL + l`` lies in ``[0, W)``.

    ``filters`` ``F > 1`` (:func:`filters_per_vector`; one call of one
    vector a row): for each filter ``f``, its store mask (lanes ``[f*Q,
    (f+1)*Q)``), then its load masks: of the ``sw`` loaded halves' ``sw*VL``
    positions ``P = h*VL + l``, those of its lanes (``f*Q*sw <= P <
    (f+1)*Q*sw``) whose column ``P - f*Q*sw - pad_left + e`` lies in ``[0, W)``
    (its load starts ``f*Q*sw`` elements before its row).
    """
    g = geometry
    groups = load_groups(g.kernel_width, g.dilation_w, g.stride_w)
    if filters > 1:
        return _side_by_side_masks(g, lanes, filters, groups)
    bits = np.int64(1) << np.arange(lanes, dtype=np.int64)
    lane = np.arange(lanes)
    entries = []
    for q0 in row_calls(g.out_width, vectors * lanes):
        for u in range(vectors):
            entries.append((((q0 + u * lanes + lane) < g.out_width) * bits).sum())
            for e in groups:
                for half in range(g.stride_w):
                    column = (
                        q0 * g.stride_w - g.pad_left + u * lanes * g.stride_w + e + half * lanes
                    ) + lane
                    entries.append((((column >= 0) & (column < g.width)) * bits).sum())
    return np.array(entries, dtype=np.int64).astype(np.uint32).view(np.int32)


def _side_by_side_masks(g: ConvGeometry, lanes: int, filters: int, groups: dict) -> np.ndarray:
    """:func:`mask_table` for ``filters > 1`` side by side in one vector."""
    bits = np.int64(1) << np.arange(lanes, dtype=np.int64)
    lane = np.arange(lanes)
    span = g.out_width * g.stride_w
    entries = []
    for f in range(filters):
        stored = (lane >= f * g.out_width) & (lane < (f + 1) * g.out_width)
        entries.append((stored * bits).sum())
        for e in groups:
            for half in range(g.stride_w):
                position = half * lanes + lane
                column = position - f * span - g.pad_left + e
                ours = (position >= f * span) & (position < (f + 1) * span)
                entries.append(((ours & (column >= 0) & (column < g.width)) * bits).sum())
    return np.array(entries, dtype=np.int64).astype(np.uint32).view(np.int32)


def vector_mask_table(geometry: ConvGeometry, lanes: int, vectors: int) -> np.ndarray:
    """The load masks of :func:`mask_table` as lane vectors for the
    whole-load kernel: int32 ``[calls][U][groups * sw][VL]``, all ones where
    the bit is set, else 0 (:func:`~cso.analysis.plane_shapes.lane_vectors`)."""
    return _load_lane_vectors(geometry, mask_table(geometry, lanes, vectors), lanes, vectors)


def _load_lane_vectors(geometry: ConvGeometry, table, lanes: int, vectors: int) -> np.ndarray:
    """:func:`vector_mask_table` from the :func:`mask_table` ``table``."""
    per_vector = entries_per_call(geometry, vectors) // vectors
    return lane_vectors(table.reshape(-1, vectors, per_vector)[:, :, 1:], lanes)


def tail_lanes(geometry: ConvGeometry, lanes: int, vectors: int) -> int:
    """The lanes the last vector of a row's one call stores, ``Q - (U-1)*VL``,
    where the row is narrower than a call's ``U*VL`` outputs; 0 where every
    call's stores are whole (:func:`row_calls` ends the last at the edge)."""
    span = vectors * lanes
    if geometry.out_width >= span:
        return 0
    return geometry.out_width - (vectors - 1) * lanes


def load_span(geometry: ConvGeometry, lanes: int, vectors: int) -> int:
    """Elements of an input row a whole-load call reads from its first
    column: ``(U*sw)*VL + max(e)`` for the :func:`load_groups` offsets
    ``e`` (the whole vectors of every group's halves)."""
    g = geometry
    groups = load_groups(g.kernel_width, g.dilation_w, g.stride_w)
    return vectors * g.stride_w * lanes + max(groups)


def full_interior_vectors(geometry: ConvGeometry, lanes: int, vectors: int) -> bool:
    """Whether every call's inner vectors ``1 <= u <= U-2`` need no masks:
    ``U > 2`` and every :func:`mask_table` entry of those vectors, in every
    call, holds all ``lanes``.

    The row kernel then loads and stores them whole (a masked load cannot
    be folded into its FMA): only each call's first and last vector meet
    the row's edges.  On a Xeon, ``dw 3x3 32 @56`` at one thread in blocks
    of 4 rows ran 12.8 cycles an output vector masked throughout, 10.2 so.
    """
    if vectors <= 2:
        return False
    per_vector = entries_per_call(geometry, vectors) // vectors
    full = (1 << lanes) - 1
    table = mask_table(geometry, lanes, vectors).view(np.uint32).astype(np.int64)
    entries = table.reshape(-1, vectors, per_vector)[:, 1 : vectors - 1]
    return bool(np.all(entries == full))


def block_window_rows(geometry: ConvGeometry, rows_per_call: int) -> int:
    """Input rows a block of ``B`` output rows reads: ``(B-1)*sh + (R-1)*dh + 1``."""
    return rows_read(rows_per_call, geometry.kernel_height, geometry.stride_h, geometry.dilation_h)


def block_starts(out_height: int, rows_per_call: int) -> list:
    """The first output row of each block of a plane: every ``B`` rows, the
    last at ``P - B`` so that it ends at the plane's last row (overlapping
    the one before, computing some rows twice, alike); ``B <= P``."""
    return [min(p, out_height - rows_per_call) for p in range(0, out_height, rows_per_call)]


def window_rows_on_plane(top: int, window_rows: int, height: int) -> tuple:
    """``(i_first, i_last)``: the rows ``i_first <= i < i_last`` of a window
    of ``window_rows`` input rows from row ``top`` that lie on the plane,
    ``max(0, -top)`` and ``min(window_rows, H - top)`` (the nest's two lines;
    empty when ``i_last <= i_first``)."""
    return max(0, -top), min(window_rows, height - top)


def row_offsets(geometry: ConvGeometry, lanes: int, vectors: int, filters: int = 1) -> np.ndarray:
    """What the row nest reads besides the operands, as one int32 array: the
    number of calls ``n`` a row takes, their ``q0`` (:func:`row_calls`), the
    :func:`mask_table` (from ``1 + n``), then the :func:`vector_mask_table`
    (none for filters side by side, whose kernel loads under bit sets only)."""
    starts = row_calls(geometry.out_width, vectors * lanes)
    head = np.array([len(starts)] + starts, dtype=np.int32)
    table = mask_table(geometry, lanes, vectors, filters)
    if filters > 1:
        return np.concatenate([head, table])
    vector_masks = _load_lane_vectors(geometry, table, lanes, vectors)
    return np.concatenate([head, table, vector_masks.ravel()])


def window_row_taps(kernel_height: int, stride_h: int, dilation_h: int, rows: int) -> dict:
    """``{i: [(b, r), ...]}``: each window row ``i`` a block of ``rows``
    output rows reads, and the (output row, filter row) pairs it serves,
    ``b*sh + r*dh = i``, in ``r`` order (the row kernel loads row ``i`` once
    for all of them)."""
    served: dict = {}
    for r in range(kernel_height):
        for b in range(rows):
            served.setdefault(b * stride_h + r * dilation_h, []).append((b, r))
    return served


def served_rows(geometry: ConvGeometry, rows_per_call: int) -> int:
    """Window rows a block's taps read: the distinct ``b*sh + r*dh`` of
    :func:`window_row_taps` (each loaded once for every output row it serves)."""
    g = geometry
    return len(window_row_taps(g.kernel_height, g.stride_h, g.dilation_h, rows_per_call))


def on_plane_taps(geometry: ConvGeometry, rows_per_call: int) -> list:
    """``[(rows, taps), ...]``, one a :func:`block_starts`: the window rows
    the block reads that lie on the plane (:func:`window_rows_on_plane`) and
    the (output row, filter row) pairs they serve (:func:`window_row_taps`),
    each ``S`` column taps of a vector.

    The row kernel skips a window row off the plane (its taps would add
    zeros): where the blocks' starts are constants of the nest, LLVM drops
    those rows' loads and FMAs, else one branch a row skips them.  On a Xeon
    (Sapphire Rapids, one thread, the nest alone, warm) against reading the
    row of zeros: ``dw 5x5 672 @14`` 38.4 against 42.3 us, ``3x3 480 @14``
    14.2 against 16.0, ``5x5 240 @28`` 58.4 against 60.4; ``3x3 144 @56``
    (blocks in a loop) and ``5x5/2 144 @56`` unchanged.
    """
    g = geometry
    served = window_row_taps(g.kernel_height, g.stride_h, g.dilation_h, rows_per_call)
    window = block_window_rows(g, rows_per_call)
    blocks = []
    for p in block_starts(g.out_height, rows_per_call):
        first, last = window_rows_on_plane(p * g.stride_h - g.pad_top, window, g.height)
        on_plane = [i for i in served if first <= i < last]
        blocks.append((len(on_plane), sum(len(served[i]) for i in on_plane)))
    return blocks


def row_kernel_loads(
    geometry: ConvGeometry, vectors: int, rows_per_call: int = 1, vector_registers: int = 32,
    filters: int = 1, window_rows: int = None,
) -> int:  # fmt: skip
    """``U * I * (groups * sw + (S if sw > 1 else 0)) + W + U * (1 + groups
    * sw)`` for ``I`` window rows (``window_rows``; None: the
    :func:`served_rows`): a call's vector loads and, at
    ``sw > 1``, its shuffles, counted alike (each takes a load port or the
    shuffle port, whose rate the FMAs beside them do not set), then its
    weight broadcasts ``W`` and the masks it reads, which every call loads
    again.  The kernel broadcasts a load group's weights as it starts the
    group, in every vector column: ``W = U * R*S`` when a group's (``R``
    times its taps) fit in the registers beside the ``B`` chains of FMAs
    and three loaded vectors, else ``B * U * R*S``: each FMA then reads its
    weight from memory.  A one-row call has ``I = R``.  ``F`` filters side
    by side (:func:`filters_per_vector`) take all of it ``F`` times: each
    vector is merged from ``F`` masked loads, each weight from ``F``
    broadcasts, under ``F`` filters' masks."""
    g = geometry
    groups = load_groups(g.kernel_width, g.dilation_w, g.stride_w)
    shuffles = g.kernel_width if g.stride_w > 1 else 0
    if window_rows is None:
        window_rows = served_rows(g, rows_per_call)
    data = vectors * window_rows * (len(groups) * g.stride_w + shuffles)
    taps = g.kernel_height * g.kernel_width
    live_weights = g.kernel_height * max(len(group) for group in groups.values())
    weights = vectors * taps if live_weights + rows_per_call + 3 <= vector_registers else (
        rows_per_call * vectors * taps
    )
    return filters * (data + weights + vectors * (1 + len(groups) * g.stride_w))


def row_block_options(geometry: ConvGeometry, vector_registers: int, lanes: int) -> list:
    """The blocks of output rows a call may hold, in order of preference: one
    row, then, where :func:`~cso.analysis.tap_rules.offers_row_blocks`, as many
    rows as :func:`max_block_rows` allows, split evenly down the plane."""
    g = geometry
    options = [1]
    if tap_rules.offers_row_blocks(g):
        largest = max_block_rows(g, vector_registers, lanes)
        rows = even_split(g.out_height, largest)
        if rows > 1:
            options.append(rows)
    return options


def row_traffic(
    geometry: ConvGeometry, hardware: Hardware, element_bytes: int, threads: int,
    rows_per_call: int = 1, filters: int = 1,
) -> Traffic:  # fmt: skip
    """What one (filter, image) plane costs under the row nest, modelled.

    Counts per job: the compulsory bytes (its input plane, ``R*S`` taps and
    output plane) from the level the whole call's operands fit in; nothing
    packed; the :func:`block_starts` times the :func:`row_calls` of a row,
    each of ``U * VL * S`` multiply-adds a tap of its window rows on the
    plane (:func:`on_plane_taps`; padding lanes of a narrow row and rows
    computed twice included) and :func:`row_kernel_loads` loads (of those
    rows), priced by :func:`~cso.analysis.depthwise.tap_kernel_cost`
    (``tap_load_cost`` a load, as the one-row tap kernel's unaligned loads),
    each call at ``row_call_cost`` and the plane at ``row_job_cost``,
    measured in the row nest itself.  With ``filters`` ``F`` side by side
    a job is ``F`` planes (``ceil(K / F)`` jobs an image) whose calls hold
    all ``F`` in the same ``B * U * VL`` lanes.
    Scaled by the busiest thread's share of the ``N * ceil(K / F)`` jobs,
    and given per filter (:func:`~cso.analysis.depthwise.per_channel`).
    """
    g = geometry
    s = element_bytes
    lanes = max(1, hardware.vector_bytes // s)
    vectors = row_vectors_per_call(g, lanes, hardware.vector_registers)
    row_call_count = len(row_calls(g.out_width, vectors * lanes))
    blocks = on_plane_taps(g, rows_per_call)
    calls = len(blocks) * row_call_count
    taps = g.kernel_height * g.kernel_width
    job = job_traffic(
        hardware,
        s,
        threads,
        jobs=g.batch * ceil_div(g.filters, filters),
        job_bytes=filters * (g.height * g.width + taps + g.out_height * g.out_width) * s,
        calls=calls,
        macs=row_call_count * sum(pairs for _, pairs in blocks) * vectors * lanes * g.kernel_width,
        loads=row_call_count
        * sum(
            row_kernel_loads(g, vectors, rows_per_call, hardware.vector_registers, filters, rows)
            for rows, _ in blocks
        ),
        packed_elements=0,
        call_cost=hardware.weights.row_call_cost,
        job_cost=hardware.weights.row_job_cost,
        # Measured at stride 1; a stride-2 call's loads come with shuffles the
        # probe did not time, so the tap kernel's rate stands in there.
        load_cost=hardware.weights.unpacked_load_cost if g.stride_w == 1 else None,
    )
    # Per filter, as the other families are priced (per channel, per group).
    return per_channel(job, filters)


def plan_rows(
    geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int,
    filters_prepacked: bool = False,
) -> Plan:  # fmt: skip
    """The row plan of ``geometry`` (which must be :func:`is_row_depthwise`):
    of :func:`row_block_options`, each with one filter a call and, where
    more fit, :func:`filters_per_vector` side by side (the plan's
    ``filters_per_tile``), the cheapest, near-ties to the first;
    ``filters_prepacked`` changes nothing (packed, the filters are the KCRS rows)."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    side_by_side = filters_per_vector(geometry, lanes)
    options = []
    for filters in sorted({1, side_by_side}):
        for rows in row_block_options(geometry, hardware.vector_registers, lanes):
            traffic = row_traffic(geometry, hardware, element_bytes, threads, rows, filters)
            options.append((traffic.cost, (rows, filters, traffic)))
    rows, filters, traffic = first_within(options)
    return untiled_plan(
        geometry, dtype_name, hardware, threads, traffic, Algorithm.DEPTHWISE_ROWS,
        row_vectors_per_call(geometry, lanes, hardware.vector_registers) * lanes, rows,
        filters_per_tile=filters,
    )  # fmt: skip


def with_filters_per_call(plan: Plan, filters: int) -> Plan:
    """``plan`` (a row plan) computing ``filters`` filters a call (1, or its
    geometry's :func:`filters_per_vector`), its modelled traffic the row
    model's for them: what a measurement of the one-filter kernel runs."""
    g = plan.geometry
    traffic = row_traffic(
        g, plan.hardware, np.dtype(plan.dtype).itemsize, plan.threads, plan.rows_per_call, filters
    )
    costs = tuple((schedule, traffic) for schedule, _ in plan.costs)
    return dataclasses.replace(plan, filters_per_tile=filters, costs=costs)
