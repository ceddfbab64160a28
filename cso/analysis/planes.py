"""The plane algorithm: stride-1 depthwise convolutions on the planes as given.

The tap plan (:mod:`.depthwise`) packs each channel into padded rows and
the lane plan (:mod:`.lanes`) transposes blocks of channels into pixel
vectors and back: both pay a pass over the data that a memory-bound layer
feels.  Where the stride is 1 and the output is as wide as the input
(``Q == W``: the horizontal padding adds up to ``(S-1)*dw``), output pixel
``f = p*W + q`` of a channel reads tap ``(r, s)`` from input pixel ``f +
(r*dh - pad_top)*W + (s*dw - pad_left)`` of the flattened plane: the same
shift for every pixel.  So a vector of ``VL`` consecutive output pixels is
``R*S`` unaligned vector loads of the unpadded input times broadcast taps
(:mod:`cso.microkernels.plane_taps`), and nothing is packed.  Masks zero
the taps that fall off the plane: per vector and tap column ``s`` where
``q + s*dw - pad_left`` leaves ``[0, W)`` (whole loads and a bitwise and
with a lane vector, :func:`column_table`, which repeats every
:func:`column_period` vectors), and, for the few vectors near the top and
bottom, per tap where the row leaves ``[0, H)`` (whole loads and a lane
vector per tap, :func:`edge_table`, but masked loads where a whole one
would leave the input).  They are computed once per plan
(:func:`mask_table`).

Each load feeds one FMA and most are split across two cache lines, so the
kernel runs at its loads' rate (``tap_load_cost``, as the one-row tap
kernel does); what it saves is the packing, which is the whole difference
on large planes.  On a Xeon (Sapphire Rapids), one thread, MobileNetV2's
``dw 3x3 32 @112``, ``144 @56`` and ``192 @28`` ran 1.3-1.7x faster than
their tap plans; 5x5 layers, two thirds of whose loads the lane kernel
saves, ran 0.55-0.68x as fast as their lane plans.  The model weighs them.

Small planes take one call each (:func:`whole_plane_call`: every output
vector's taps unrolled, the weights held in registers), by a kernel built
for the plane's geometry (:mod:`cso.microkernels.whole_plane_taps`): each
input vector of the plane is loaded whole once and each tap's vector is a
shuffle of two of them; which taps a vector skips, takes whole or masks is
known when it is built (:func:`tap_coverage`).  On an AMD EPYC (Zen 5), one
thread, MobileNetV2's and EfficientNet-B0's 3x3 layers of 7x7, 14x14 and
28x28 planes ran 1.0-1.5x faster so than the lane and row plans.
"""

from __future__ import annotations

import math

import numpy as np

from ..geometry import ConvGeometry, make_geometry
from .choices import Algorithm
from .pricing import Traffic
from .depthwise import job_traffic, untiled_plan
from .hardware import Hardware
from .plan import Plan
from .plane_shapes import (  # noqa: F401 (re-exported)
    MAX_PLANE_LANES,
    VECTORS_PER_CALL,
    is_plane_depthwise,
    lane_vectors,
    output_vectors,
    vectors_per_call,
    whole_plane_call,
)


def mask_entries(geometry: ConvGeometry) -> int:
    """Entries of the mask table a vector: ``1 + S + R*S``."""
    return 1 + geometry.kernel_width + geometry.kernel_height * geometry.kernel_width


def mask_table(geometry: ConvGeometry, lanes: int):
    """``(table, checked)``: the kernel's lane masks and which vectors need
    the per-tap ones.

    For output vector ``v`` (pixels ``f = v*VL + l``, ``p, q = divmod(f, Q)``),
    as bit sets of lanes ``l`` (int32, ``1 + S + R*S`` entries a vector):

    * entry 0, the stores: ``f < P*Q``;
    * entry ``1 + s``: also ``0 <= q + s*dw - pad_left < W``;
    * entry ``1 + S + r*S + s``: also ``0 <= p + r*dh - pad_top < H``.

    ``checked[v]`` is True where some entry ``1 + S + r*S + s`` differs from
    ``1 + s`` or entry 0 is not every lane: those vectors need the per-tap
    masks (and the masked stores).
    """
    g = geometry
    count = output_vectors(g, lanes)
    pixels = np.arange(count * lanes).reshape(count, lanes)
    bits = np.int64(1) << np.arange(lanes, dtype=np.int64)
    p, q = np.divmod(pixels, g.out_width)
    inside = pixels < g.out_height * g.out_width

    def bitset(valid):
        return (valid.astype(np.int64) * bits).sum(axis=1)

    columns = [inside & (0 <= q + s * g.dilation_w - g.pad_left) for s in range(g.kernel_width)]
    columns = [
        valid & (q + s * g.dilation_w - g.pad_left < g.width) for s, valid in enumerate(columns)
    ]
    rows = [
        (0 <= p + r * g.dilation_h - g.pad_top) & (p + r * g.dilation_h - g.pad_top < g.height)
        for r in range(g.kernel_height)
    ]
    entries = [bitset(inside)] + [bitset(valid) for valid in columns]
    checked = ~inside.all(axis=1)
    plane = g.height * g.width
    for r in range(g.kernel_height):
        for s in range(g.kernel_width):
            entries.append(bitset(columns[s] & rows[r]))
            checked |= (columns[s] & ~rows[r]).any(axis=1)
            # An unchecked vector's loads are whole: every lane must lie in the plane.
            shift = (r * g.dilation_h - g.pad_top) * g.width + s * g.dilation_w - g.pad_left
            source = pixels + shift
            checked |= ((source < 0) | (source >= plane)).any(axis=1)
    table = np.stack(entries, axis=1)
    # Lane 31's bit as int32's sign: the kernel truncates, so only the bits matter.
    return table.astype(np.uint32).view(np.int32).ravel(), checked


def column_period(geometry: ConvGeometry, lanes: int) -> int:
    """``T = Q / gcd(Q, VL)``: output vector ``v``'s pixels have columns
    ``(v*VL + l) mod Q``, the same as vector ``v + T``'s, and so do its
    column masks."""
    return geometry.out_width // math.gcd(geometry.out_width, lanes)


def column_table(geometry: ConvGeometry, lanes: int, per_call: int) -> np.ndarray:
    """The unchecked kernel's column masks as whole lane vectors: int32
    ``[T + U - 1][S][VL]``, entry ``[i, s, l]`` all ones where ``0 <= q +
    s*dw - pad_left < W`` for ``q = (i*VL + l) mod Q``, else 0.

    A call from vector ``v0`` reads rows ``v0 mod T`` to ``v0 mod T + U -
    1``: the ``U - 1`` rows past one period spare the kernel a modulo.  A
    vector mask is one load where a bit set (:func:`mask_table`) is four
    instructions to expand, and the tap columns' masks then need no register
    each across the ``R`` rows of taps (on AVX2 they had spilled)."""
    g = geometry
    rows = column_period(g, lanes) + per_call - 1
    q = np.arange(rows * lanes).reshape(rows, 1, lanes) % g.out_width
    s = np.arange(g.kernel_width).reshape(1, -1, 1)
    column = q + s * g.dilation_w - g.pad_left
    return np.where((0 <= column) & (column < g.width), -1, 0).astype(np.int32)


def call_schedule(checked: np.ndarray, per_call: int) -> list:
    """``[(v0, checked), ...]``: one plane's kernel calls, ``per_call``
    vectors each from ``v0``, the last starting early enough to end at the
    plane's last vector (it overlaps the one before and computes some
    outputs twice, alike); a call is checked when any of its vectors is."""
    count = len(checked)
    calls, v = [], 0
    while v < count:
        start = min(v, count - per_call)
        calls.append((start, bool(checked[start : start + per_call].any())))
        v += per_call
    return calls


def edge_table(geometry: ConvGeometry, lanes: int) -> np.ndarray:
    """Every output vector's tap masks as whole lane vectors, for the
    whole-load edge kernel: int32 ``[vectors][R*S][VL]``, entry ``[v, r*S +
    s, l]`` all ones where :func:`mask_table`'s bit of tap ``(r, s)`` is set
    for lane ``l`` of vector ``v``, else 0.  A checked call from ``v0`` reads
    rows ``v0 .. v0 + U - 1``."""
    table, _ = mask_table(geometry, lanes)
    return _tap_lane_vectors(geometry, table, lanes)


def _tap_lane_vectors(geometry: ConvGeometry, table, lanes: int) -> np.ndarray:
    """:func:`edge_table` from the :func:`mask_table` ``table``."""
    bit_sets = table.reshape(-1, mask_entries(geometry))
    return lane_vectors(bit_sets[:, 1 + geometry.kernel_width :], lanes)


def tail_lanes(geometry: ConvGeometry, lanes: int) -> int:
    """``P*Q mod VL``: the lanes of a plane's last output vector, 0 when whole."""
    return (geometry.out_height * geometry.out_width) % lanes


def plane_key(geometry: ConvGeometry) -> tuple:
    """What a whole-plane kernel is built for: ``(R, S, dh, dw, H, W,
    pad_top, pad_bottom, pad_left, pad_right)``."""
    g = geometry
    return (
        g.kernel_height, g.kernel_width, g.dilation_h, g.dilation_w, g.height, g.width,
        g.pad_top, g.pad_bottom, g.pad_left, g.pad_right,
    )  # fmt: skip


def plane_geometry(key: tuple) -> ConvGeometry:
    """A depthwise geometry of one image and two channels with the planes
    of :func:`plane_key`'s ``key``."""
    kernel_height, kernel_width, dh, dw, height, width, top, bottom, left, right = key
    return make_geometry(
        (1, 2, height, width), (2, 1, kernel_height, kernel_width),
        padding=((top, bottom), (left, right)), dilation=(dh, dw), groups=2,
    )  # fmt: skip


def tap_coverage(geometry: ConvGeometry, lanes: int) -> list:
    """``[u][r*S + s]`` for each output vector of a plane and tap: 0 where
    the tap falls off the plane in every lane the vector stores, 1 where it
    lies on it in every one, 2 where only in some (from :func:`mask_table`):
    what a whole-plane kernel skips, takes whole, or masks."""
    g = geometry
    table, _ = mask_table(g, lanes)
    bits = table.reshape(-1, mask_entries(g)).view(np.uint32).astype(np.int64)
    stored = bits[:, :1]
    on_plane = bits[:, 1 + g.kernel_width :] & stored
    coverage = np.where(on_plane == 0, 0, np.where(on_plane == stored, 1, 2))
    return [tuple(int(c) for c in row) for row in coverage]


def tap_shifts(geometry: ConvGeometry, lanes: int) -> list:
    """``[(k, m, d)]`` for each tap ``t = r*S + s``: its shift from a
    whole-plane call's start, ``r*dh*W + s*dw = k*VL + m`` (``0 <= m < VL``),
    and its column shift ``d = s*dw - pad_left``."""
    g = geometry
    return [
        divmod(r * g.dilation_h * g.width + s * g.dilation_w, lanes)
        + (s * g.dilation_w - g.pad_left,)
        for r in range(g.kernel_height)
        for s in range(g.kernel_width)
    ]


def grid_masks(geometry: ConvGeometry, lanes: int) -> dict:
    """``{d: keep}`` for each column shift ``d = s*dw - pad_left`` of the
    filter's taps: ``keep[j][l]``, whether lane ``l`` of the whole vector
    ``j`` a whole-plane call loads (plane element ``e = j*VL + l - pad_top*W
    - pad_left``) may feed a tap of that shift: ``0 <= e < H*W`` and its
    column ``c = e mod W`` not one a shifted read only reaches by wrapping
    round a row (``c < d`` for ``d > 0``, ``c >= W + d`` for ``d < 0``).

    A tap's vector shuffled from vectors so masked is zero wherever
    :func:`mask_table` clears the tap's lane, so no tap needs a mask of its
    own: a read leaves its output row only by wrapping into such a column,
    and leaves the plane only outside ``[0, H*W)``."""
    g = geometry
    count = grid_vectors(g, lanes)
    element = np.arange(count * lanes).reshape(count, lanes) - (g.pad_top * g.width + g.pad_left)
    inside = (element >= 0) & (element < g.height * g.width)
    column = element % g.width
    masks = {}
    for s in range(g.kernel_width):
        d = s * g.dilation_w - g.pad_left
        wraps = column < d if d > 0 else column >= g.width + d
        masks[d] = inside & ~wraps
    return masks


def grid_vectors(geometry: ConvGeometry, lanes: int) -> int:
    """The whole vectors a whole-plane call loads from its ``in_offset``:
    ``1 + max(u + k + [m > 0])`` over the output vectors ``u`` and the taps
    on the plane there, with ``r*dh*W + s*dw = k*VL + m``
    (:mod:`cso.microkernels.whole_plane_taps`)."""
    shifts = tap_shifts(geometry, lanes)
    reach = 0
    for u, row in enumerate(tap_coverage(geometry, lanes)):
        for (k, m, _), covered in zip(shifts, row):
            if covered:
                reach = max(reach, u + k + (1 if m else 0))
    return reach + 1


def load_span(geometry: ConvGeometry, lanes: int, vector_registers: int) -> int:
    """Elements a call's whole loads reach from its first: ``grid_vectors *
    VL`` where a call computes a whole plane (:func:`grid_vectors`), else
    ``U*VL + (R-1)*dh*W + (S-1)*dw``."""
    g = geometry
    if whole_plane_call(g, lanes, vector_registers):
        return grid_vectors(g, lanes) * lanes
    return (
        vectors_per_call(g, lanes, vector_registers) * lanes
        + (g.kernel_height - 1) * g.dilation_h * g.width
        + (g.kernel_width - 1) * g.dilation_w
    )


def plane_offsets(geometry: ConvGeometry, lanes: int, vector_registers: int) -> np.ndarray:
    """What the plane nest reads besides the operands, as one int32 array:
    the number of calls ``n``; ``n`` triples ``(v0, checked, vector_masks)``,
    the first two :func:`call_schedule`'s and ``vector_masks`` where the
    call's lane-vector masks start in this array (its :func:`column_table`
    rows, or a checked call's :func:`edge_table` rows); the
    :func:`mask_table` (from ``1 + 3n``); the :func:`column_table`; then each
    checked call's ``U`` rows of the :func:`edge_table`."""
    table, checked = mask_table(geometry, lanes)
    if whole_plane_call(geometry, lanes, vector_registers):
        # One call, marked checked and given the edge table's rows; neither its
        # kernel nor the masked one at the input's ends reads those rows.
        checked = np.ones_like(checked)
    per_call = vectors_per_call(geometry, lanes, vector_registers)
    calls = call_schedule(checked, per_call)
    period = column_period(geometry, lanes)
    columns = column_table(geometry, lanes, per_call).ravel()
    columns_at = _aligned(1 + 3 * len(calls) + len(table))
    edges_at = _aligned(columns_at + len(columns))
    row = geometry.kernel_width * lanes
    taps = _tap_lane_vectors(geometry, table, lanes)
    head, edges, edge_elements = [len(calls)], [], 0
    for v0, is_checked in calls:
        if is_checked:
            head += [v0, 1, edges_at + edge_elements]
            edges.append(taps[v0 : v0 + per_call].ravel())
            edge_elements += len(edges[-1])
        else:
            head += [v0, 0, columns_at + (v0 % period) * row]
    offsets = np.empty(edges_at + edge_elements, dtype=np.int32)
    offsets[: len(head)] = head
    offsets[len(head) : len(head) + len(table)] = table
    offsets[len(head) + len(table) : columns_at] = 0
    offsets[columns_at : columns_at + len(columns)] = columns
    offsets[columns_at + len(columns) : edges_at] = 0
    offsets[edges_at:] = np.concatenate(edges) if edges else []
    return offsets


# Where the lane-vector masks start in the nest's offsets, in int32 elements:
# each mask vector then lies in one cache line (the launch puts the array
# itself on a 64-byte boundary).  On an AMD EPYC (Zen 5), one thread, when
# the whole-plane kernel still read its masks from the edge table, `dw 3x3
# 960 @7` ran 1.34x slower with the table 4 bytes off a 16-byte boundary (a
# prototype nest), and `384 @14` 16.2 us with it aligned against 18.7; the
# table's calls read their masks so still.
MASK_ALIGNMENT = 16


def _aligned(elements: int) -> int:
    """``elements`` rounded up to a multiple of :data:`MASK_ALIGNMENT`."""
    return -(-elements // MASK_ALIGNMENT) * MASK_ALIGNMENT


def plane_traffic(
    geometry: ConvGeometry, hardware: Hardware, element_bytes: int, threads: int
) -> Traffic:
    """What one (filter, image) plane costs under the plane nest, modelled.

    Counts per job: the compulsory bytes (the input plane it reads, its
    ``R*S`` taps and its output plane) from the level the whole call's
    operands fit in; nothing packed; the :func:`call_schedule`'s calls of
    ``per_call * VL * R*S`` multiply-adds and :func:`plane_kernel_loads`
    loads, priced by :func:`~cso.analysis.depthwise.tap_kernel_cost` at
    the one-row tap kernel's rate (``tap_load_cost`` less an FMA: the plane
    kernel too issues one unaligned load beside each FMA; priced at the row
    kernel's rate, the model took such plans for EfficientNet-B0's ``dw 5x5
    1152 @7``, 2.1x slower than its lane plan on a Zen 5); each call at
    ``plane_call_cost``.  Where one call computes the plane
    (:func:`whole_plane_call`), one call of :func:`whole_plane_loads` and a
    multiply-add a lane of each tap on the plane, at ``plane_load_cost`` (the
    row kernel's where not measured): call and load cost are measured in
    the plane nest on 7x7 planes, which are whole-plane calls.  Scaled by
    the busiest thread's share of the ``N * K`` jobs.
    """
    g = geometry
    s = element_bytes
    lanes = max(1, hardware.vector_bytes // s)
    taps = g.kernel_height * g.kernel_width
    registers = hardware.vector_registers
    if whole_plane_call(g, lanes, registers):
        coverage = tap_coverage(g, lanes)
        calls = 1
        macs = sum(1 for row in coverage for covered in row if covered) * lanes
        loads = whole_plane_loads(g, lanes)
        load_cost = hardware.weights.plane_load_cost or hardware.weights.unpacked_load_cost
    else:
        per_call = vectors_per_call(g, lanes, registers)
        _, checked = mask_table(g, lanes)
        schedule = call_schedule(checked, per_call)
        checked_calls = sum(1 for _, is_checked in schedule if is_checked)
        calls = len(schedule)
        macs = calls * per_call * lanes * taps
        loads = plane_kernel_loads(calls, checked_calls, per_call, taps, g.kernel_width)
        # One unaligned load beside each FMA, as the one-row tap kernel issues:
        # its pair's measured rate (0 asks tap_kernel_cost for it).
        load_cost = 0.0
    return job_traffic(
        hardware,
        s,
        threads,
        jobs=g.batch * g.filters,
        job_bytes=(g.height * g.width + taps + g.out_height * g.out_width) * s,
        calls=calls,
        macs=macs,
        loads=loads,
        packed_elements=0,
        call_cost=hardware.weights.plane_call_cost,
        load_cost=load_cost,
    )


def whole_plane_loads(geometry: ConvGeometry, lanes: int) -> int:
    """``taps + masked``: a whole-plane call's tap vectors (one for each
    output vector and tap on the plane, :func:`tap_coverage`: a shuffle of
    loaded vectors, or one of them), and the loaded vectors it ands with a
    column shift's mask (:func:`grid_masks`: those a tap of that shift reads
    whose mask clears some lanes, once each)."""
    keep = grid_masks(geometry, lanes)
    shifts = tap_shifts(geometry, lanes)
    taps, masked = 0, set()
    for u, row in enumerate(tap_coverage(geometry, lanes)):
        for (k, m, d), covered in zip(shifts, row):
            if not covered:
                continue
            taps += 1
            for j in (u + k, u + k + 1) if m else (u + k,):
                if keep[d][j].any() and not keep[d][j].all():
                    masked.add((j, d))
    return taps + len(masked)


def plane_kernel_loads(
    calls: int, checked_calls: int, per_call: int, taps: int, kernel_width: int
) -> int:
    """``calls * U * R*S + checked * U * R*S + (calls - checked) * U * S``:
    one vector load per tap and output vector; in a checked call one mask
    beside each, in the others one mask vector per column of taps (it
    serves the column's ``R`` rows).  On the Xeon, 14x14 and 7x7 planes,
    most of whose calls are checked, ran 1.3-1.4x slower than large ones per
    output."""
    unchecked = calls - checked_calls
    return (calls + checked_calls) * per_call * taps + unchecked * per_call * kernel_width


def plan_planes(
    geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int,
    filters_prepacked: bool = False,
) -> Plan:  # fmt: skip
    """The plane plan of ``geometry`` (which must be :func:`is_plane_depthwise`);
    ``filters_prepacked`` changes nothing (packed, the filters are the KCRS rows)."""
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    traffic = plane_traffic(geometry, hardware, element_bytes, threads)
    return untiled_plan(
        geometry, dtype_name, hardware, threads, traffic, Algorithm.DEPTHWISE_PLANES,
        vectors_per_call(geometry, lanes, hardware.vector_registers) * lanes,
    )  # fmt: skip
