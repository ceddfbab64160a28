"""The row algorithm: depthwise convolutions on the planes as given, a run
of one output row at a time, any vertical stride and horizontal stride 1 or 2.

The plane plan (:mod:`.planes`) needs stride 1 and ``Q == W``, where one
shift maps every output pixel of a plane to its input; the lane plan
(:mod:`.lanes`) transposes every input pixel into channel vectors, a pass
that a large strided layer feels most (``dw 3x3/2 96 @112`` spent 64% of its
time there on the Xeon).  Here a kernel call computes ``U`` vectors of
consecutive outputs ``q0 .. q0 + U*VL`` of one output row
(:mod:`cso.microkernels.row_taps`): for each filter row ``r`` the input row
``p*sh + r*dh - pad_top`` (a zero row where that falls off the plane), and
for each column tap the vector of inputs ``(q0 + l)*sw + s*dw - pad_left``.
At ``sw = 2`` that is every other element of two loaded vectors, picked by
one shuffle; taps whose offsets differ by one share the two loads (the odd
and the even elements).  Column masks zero what falls off the row; they
depend only on ``q0``, so they are made once per plan for the calls of a
row (:func:`mask_table`).  Nothing is packed.

On the Xeon, one thread, against the lane plans: 1.3-1.75x faster on the
3x3 stride-2 layers of 112, 56 and 28 wide inputs (``dw 3x3/2 96 @112`` 207
against 320-360 us, at its L3 roofline), level on ``dw 5x5/2 144 @56``, and
1.5-3x slower on 14x14 inputs, whose 7-wide rows fill 7 of 16 lanes.  The
model weighs them.
"""

from __future__ import annotations

import numpy as np

from ..geometry import ConvGeometry
from .choices import Algorithm
from .cost import Traffic
from .depthwise import job_traffic, untiled_plan
from .hardware import Hardware
from .plan import Plan
from .plane_shapes import (  # noqa: F401 (re-exported)
    MAX_ROW_STRIDE,
    is_row_depthwise,
    row_vectors_per_call,
)


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


def entries_per_call(geometry: ConvGeometry, vectors: int) -> int:
    """Mask-table entries a call: ``U * (1 + groups * sw)``: each vector's
    store mask, then its load masks."""
    g = geometry
    groups = len(load_groups(g.kernel_width, g.dilation_w, g.stride_w))
    return vectors * (1 + groups * g.stride_w)


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


def mask_table(geometry: ConvGeometry, lanes: int, vectors: int) -> np.ndarray:
    """The row kernel's masks for every call of a row, as int32 bit sets of
    the lanes: for call ``j`` and vector ``u`` (outputs ``q = q0 + u*VL + l``),
    ``entries_per_call / U`` entries: the store mask ``q < Q``, then for each
    load group ``e`` (:func:`load_groups`) and half ``h < sw`` the lanes whose
    column ``q0*sw - pad_left + u*VL*sw + e + h*VL + l`` lies in ``[0, W)``."""
    g = geometry
    bits = np.int64(1) << np.arange(lanes, dtype=np.int64)
    lane = np.arange(lanes)
    groups = load_groups(g.kernel_width, g.dilation_w, g.stride_w)
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


def filter_rows_on_plane(geometry: ConvGeometry) -> np.ndarray:
    """``[(r_first, r_last)] * P``: for each output row ``p``, the filter rows
    ``r_first <= r < r_last`` whose input row ``p*sh + r*dh - pad_top`` lies
    on the plane (they are consecutive).  Made once per plan: the nest would
    otherwise divide twice a row (two integer divisions took a fifth of
    ``dw 3x3/2 96 @112``'s time on the Xeon)."""
    g = geometry
    r = np.arange(g.kernel_height)
    rows = np.arange(g.out_height)[:, None] * g.stride_h + r[None, :] * g.dilation_h - g.pad_top
    on_plane = (rows >= 0) & (rows < g.height)
    first = np.where(on_plane.any(axis=1), on_plane.argmax(axis=1), 0)
    last = np.where(on_plane.any(axis=1), first + on_plane.sum(axis=1), 0)
    return np.stack([first, last], axis=1)


def row_offsets(geometry: ConvGeometry, lanes: int) -> np.ndarray:
    """What the row nest reads besides the operands, as one int32 array: the
    number of calls ``n`` a row takes, their ``q0`` (:func:`row_calls`), the
    ``P`` pairs of :func:`filter_rows_on_plane`, then the :func:`mask_table`
    (from ``1 + n + 2P``)."""
    vectors = row_vectors_per_call(geometry, lanes)
    starts = row_calls(geometry.out_width, vectors * lanes)
    head = np.array([len(starts)] + starts, dtype=np.int32)
    bounds = filter_rows_on_plane(geometry).astype(np.int32).ravel()
    return np.concatenate([head, bounds, mask_table(geometry, lanes, vectors)])


def row_kernel_loads(geometry: ConvGeometry, vectors: int) -> int:
    """``U * R * (groups * sw + (S if sw > 1 else 0)) + R*S + U * (1 + groups
    * sw)``: a call's vector loads and, at ``sw > 1``, its shuffles, counted
    alike (each takes a load port or the shuffle port, whose rate the FMAs
    beside them do not set), then the ``R*S`` weights it broadcasts and the
    masks it reads, which every call loads again."""
    g = geometry
    groups = len(load_groups(g.kernel_width, g.dilation_w, g.stride_w))
    shuffles = g.kernel_width if g.stride_w > 1 else 0
    data = vectors * g.kernel_height * (groups * g.stride_w + shuffles)
    return data + g.kernel_height * g.kernel_width + vectors * (1 + groups * g.stride_w)


def row_traffic(
    geometry: ConvGeometry, hardware: Hardware, element_bytes: int, threads: int
) -> Traffic:
    """What one (filter, image) plane costs under the row nest, modelled.

    Counts per job: the compulsory bytes (its input plane, ``R*S`` taps and
    output plane) from the level the whole call's operands fit in; nothing
    packed; ``P`` times the :func:`row_calls` of a row, each of ``U * VL *
    R*S`` multiply-adds (padding lanes of a narrow row included) and
    :func:`row_kernel_loads` loads, priced by
    :func:`~cso.analysis.depthwise.tap_kernel_cost` (``tap_load_cost`` a load,
    as the one-row tap kernel's unaligned loads).  Scaled by the busiest
    thread's share of the ``N * K`` jobs.
    """
    g = geometry
    s = element_bytes
    lanes = max(1, hardware.vector_bytes // s)
    vectors = row_vectors_per_call(g, lanes)
    calls = g.out_height * len(row_calls(g.out_width, vectors * lanes))
    taps = g.kernel_height * g.kernel_width
    return job_traffic(
        hardware,
        s,
        threads,
        jobs=g.batch * g.filters,
        job_bytes=(g.height * g.width + taps + g.out_height * g.out_width) * s,
        calls=calls,
        macs=calls * vectors * lanes * taps,
        loads=calls * row_kernel_loads(g, vectors),
        packed_elements=0,
    )


def plan_rows(geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int) -> Plan:
    """The row plan of ``geometry`` (which must be :func:`is_row_depthwise`)."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    traffic = row_traffic(geometry, hardware, element_bytes, threads)
    return untiled_plan(
        geometry, dtype_name, hardware, threads, traffic, Algorithm.DEPTHWISE_ROWS,
        row_vectors_per_call(geometry, lanes) * lanes,
    )  # fmt: skip
