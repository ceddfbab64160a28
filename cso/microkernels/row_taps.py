"""LLVM vector IR for depthwise convolutions on unpacked planes, a block of
output rows at a time, at horizontal stride 1 or 2.

Contract
--------
One call computes ``B`` (``rows``) x ``U`` (``vectors``) vectors: outputs
``q = q0 + u*VL + l`` of output rows ``p + b`` (``b < B``) of one plane::

    out[out_offset + b*out_stride + u*VL + l] = bias + sum_{r < R, s < S}
        filters[w_offset + r*S + s]
        * row_{b*sh + r*dh}[(u*VL + l)*sw + s*dw]     (0 where the column mask is clear)

then the fused epilogue (:mod:`.epilogue`) in registers, the residual in
the output's layout (``residual_offset + b*out_stride + u*VL + l``).
``row_i``, the ``i``-th input row of the block's window (``i < (B-1)*sh +
(R-1)*dh + 1``), starts at ``inputs[in_offset + i*width]`` for ``i_first
<= i < i_last`` (the caller passes ``in_offset`` = the plane's start plus
``(p*sh - pad_top)*width + q0*sw - pad_left``); the other rows fall off
the plane, and their taps, which would add zeros, are skipped
(:func:`cso.analysis.rows.on_plane_taps` says what that saved).  Loads may
start before a row or end after it; only the masked-in lanes, inside ``[0,
width)`` of the row, are read.

Why a block of rows: input row ``i`` serves output row ``b`` through
filter row ``r`` wherever ``b*sh + r*dh = i``, so each of its vectors is
loaded (and, at ``sw = 2``, shuffled) once for all of them: a 3x3 block of
``B`` rows at stride 1 loads ``B + 2`` rows for ``3B`` rows of taps.  The
loads are unaligned and most split across two cache lines, so they, not
the FMAs, set a one-row call's pace.  Each output's taps are summed in the
same order whatever ``B``: the load groups (below) in turn, and within one
the filter rows ``r``, then the group's taps ``s``.

Why group by group: a group's weights are broadcast as it starts, so only
its ``R`` (``2R`` at ``sw = 2``) weight vectors are live beside the ``B``
sums, where all ``R*S`` of them, broadcast once a call, left too few of
AVX2's 16 registers and LLVM spilled them to the stack (1392 stack moves
beside 1080 FMAs in one nest's machine code).  On an AMD EPYC (Zen 3), one
thread, against the row-by-row order with every weight live, side by side
in one process: 3x3 layers 1.00-1.18x faster (``960 @7`` 1.18x, ``32
@112`` 1.06x), 5x5 ones 1.20-1.60x (``672 @14`` 1.60x).

Why masked FMAs: on AVX-512 each FMA of a masked column adds under a
mask register (no cost beside the FMA) where the whole-load kernel anded
every loaded vector with its load mask, an instruction on the ports the
FMAs use: 55 ands beside the 175 FMAs of a 5x5 block of 7 rows
(``llvm-mca -mcpu=sapphirerapids``: 133 cycles a block with the ands,
the FMA ports the bottleneck; 122 under masks, the FMA chains' latency
the bottleneck).  A tap's mask is its load mask (at ``sw = 2``, the two
halves' masks shuffled as the halves are, once a group).  On a Xeon
(Sapphire Rapids), EfficientNet-B0's and MobileNetV2's row-plan layers
side by side with the anded build in one process (paired rounds,
``experiments/row_masked_fmas.py``, two runs each): 5x5 at stride 1
1.05-1.12x faster at one thread, 1.04-1.17x at two; stride-2 ones @28
and @56 0.99-1.11x; the large memory-bound planes 0.94-1.07x (noise);
the ten layers' best times 1.02-1.03x at one thread, 1.05-1.06x at two.
A tap on the padding then adds nothing where it added ``0 * w``: the
results differ only for an infinite or NaN weight, whose product with
padding is NaN.

The taps of a filter row are grouped by :func:`cso.analysis.rows.load_groups`:
group ``e`` loads the ``sw`` vectors from column offset ``e`` once and each
of its taps takes the ``phase``-th of every ``sw`` elements (one
two-source shuffle within 16-byte chunks at ``sw = 2``, which leaves the
columns in :func:`in_chunk_picks`' order: every tap alike, so the sums are
put back in column order once, before the epilogue; the loaded vector
itself at ``sw = 1``).
The masks are ``masks[mask_offset + u*(1 + G*sw) + i]`` (int32 bit sets,
the same for every row of the block): ``i = 0`` the stores, ``1 + g*sw + h``
the loads of group ``g``'s half ``h``.  A kernel built ``unmasked_inner``
reads no masks for vectors ``1 <= u <= U-2``: it loads and stores them
whole, which is right only where all their masks are full in every call
(:func:`cso.analysis.rows.full_interior_vectors`).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..analysis.rows import load_groups, window_row_taps
from .epilogue import emit_epilogue
from .row_picks import in_chunk_picks, natural_order
from .vector_ir import (
    check_shape_bounds,
    I32,
    KernelEmitter,
    check_bit_set_lanes,
    check_dtype_and_lanes,
    check_float_arrays,
    check_mask_table,
    store_leading_lanes,
)


def masked_fma_vectors(dtype_name: str, vector_lanes: int) -> bool:
    """Whether vectors of ``vector_lanes`` ``dtype_name`` lanes fill 64 bytes:
    the only ones the masked FMAs (``masked_fmas``) take, AVX-512's."""
    element_bytes = 4 if dtype_name == "float32" else 8
    return int(vector_lanes) * element_bytes == 64


@functools.lru_cache(maxsize=None)
def build_row_tap_kernel(
    kernel_height: int, kernel_width: int, dilation_h: int, dilation_w: int, stride_h: int,
    stride_w: int, rows: int, vectors: int, dtype_name: str, vector_lanes: int,
    unmasked_inner: bool = False, whole_loads: bool = False, tail_lanes: int = 0,
    masked_fmas: bool = False, filters_per_vector: int = 1,
):  # fmt: skip
    """Return a Numba intrinsic computing ``rows x vectors`` output vectors of a plane.

    Parameters
    ----------
    kernel_height, kernel_width, dilation_h, dilation_w : int
        ``R``, ``S`` and the dilations: the taps are unrolled at generation.
    stride_h : int
        The vertical stride: which window rows each output row reads.
    stride_w : {1, 2}
        The horizontal stride.
    rows : int
        Output rows a call computes (``B``).
    vectors : int
        Output vectors of each row a call holds in registers (``U``).
    dtype_name : {"float32", "float64"}
    vector_lanes : int
        At most 32 (the masks are int32 bit sets).
    unmasked_inner : bool
        Load and store vectors ``1 <= u <= U-2`` whole, ignoring their
        masks: only for a caller whose masks there are all full
        (:func:`~cso.analysis.rows.full_interior_vectors`); needs ``U > 2``.
    whole_loads : bool
        Load every vector whole and zero the lanes its load mask clears by
        an and with the mask as a lane vector (the vector mask table), and
        store whole: only for a call whose loads all lie in the arrays (the
        nest checks) and whose stores are all full but for the last
        vector's ``tail_lanes``.
    tail_lanes : int
        With ``whole_loads``: the lanes the last vector of each row stores
        (its first ``tail_lanes``, in plain pieces), 0 for all of them.
    masked_fmas : bool
        On an AVX-512 target (:func:`~.vector_ir.target_has_mask_registers`;
        64-byte vectors): each FMA of a masked vector adds under its load
        mask (a mask register) instead of the loaded vector being zeroed
        outside it; the whole loads then take no and.  The taps on padding
        then add nothing rather than ``0 * w``.
    filters_per_vector : int
        ``F`` filters side by side in each vector
        (:func:`~cso.analysis.plane_shapes.filters_per_vector`): filter
        ``f < valid_filters`` of the call's first (``k0``) in lanes ``[f*Q,
        (f+1)*Q)`` for ``Q = segment``, reading its input plane
        ``f*in_step`` elements after the first's and writing its output
        plane ``f*out_step`` after, its weights and bias the ``f``-th after
        the first's (``f*R*S``, ``f``); each loaded vector merged from the
        ``F`` filters' masked loads (a filter's load starting ``f*Q*sw``
        elements before its row), its masks the
        table's ``F`` sets of entries (:func:`cso.analysis.rows.mask_table`).
        Needs one vector a call and masked loads and stores.

    Returns
    -------
    intrinsic
        ``kernel(inputs, in_offset, width, i_first, i_last, filters,
        w_offset, out, out_offset, out_stride, masks, mask_offset, vector_mask_offset,
        bias, bias_index, has_bias, residual, residual_offset, activation, has_residual,
        in_step, out_step, segment, valid_filters)`` (the last four read only where
        ``filters_per_vector > 1``).
    """
    check_dtype_and_lanes(dtype_name, vector_lanes)
    check_shape_bounds(
        ("kernel_height", kernel_height, 64), ("kernel_width", kernel_width, 64),
        ("dilation_h", dilation_h, 64), ("dilation_w", dilation_w, 64),
        ("stride_h", stride_h, 64), ("stride_w", stride_w, 2), ("rows", rows, 32),
        ("vectors", vectors, 32), ("filters_per_vector", filters_per_vector, 32),
    )  # fmt: skip
    side = filters_per_vector
    if side > 1 and (vectors != 1 or unmasked_inner or whole_loads):
        raise ValueError(
            f"filters side by side ({side}) need one vector a call and masked loads, got "
            f"vectors={vectors}, unmasked_inner={unmasked_inner}, whole_loads={whole_loads}"
        )
    if not 0 <= tail_lanes < vector_lanes or (tail_lanes and not whole_loads):
        raise ValueError(
            f"tail_lanes must be 0, or below vector_lanes ({vector_lanes}) with whole_loads, "
            f"got {tail_lanes}"
        )
    check_bit_set_lanes(vector_lanes)
    if masked_fmas and not masked_fma_vectors(dtype_name, vector_lanes):
        raise ValueError(
            f"masked_fmas needs 64-byte vectors, got {vector_lanes} {dtype_name} lanes"
        )
    if unmasked_inner and vectors <= 2:
        raise ValueError(f"unmasked_inner needs more than 2 vectors a call, got {vectors}")
    lanes = vector_lanes
    groups = load_groups(kernel_width, dilation_w, stride_w)
    per_vector = 1 + len(groups) * stride_w
    served = window_row_taps(kernel_height, stride_h, dilation_h, rows)

    @intrinsic
    def row_tap_kernel(
        typingctx, inputs, in_offset, width, i_first, i_last, filters,
        w_offset, out, out_offset, out_stride, masks, mask_offset, vector_mask_offset, bias,
        bias_index, has_bias, residual, residual_offset, activation, has_residual, in_step,
        out_step, segment, valid_filters,
    ):  # fmt: skip
        check_float_arrays(
            dtype_name, inputs=inputs, filters=filters, out=out, bias=bias, residual=residual,
        )  # fmt: skip
        check_mask_table(masks)
        intp = types.intp
        sig = types.void(
            inputs, intp, intp, intp, intp, filters, intp, out, intp, intp, masks,
            intp, intp, bias, intp, types.boolean, residual, intp, intp, types.boolean, intp,
            intp, intp, intp,
        )  # fmt: skip

        def codegen(context, builder, signature, args):
            (in_a, in_off, width_v, first_v, last_v, w_a, w_off, out_a,
             out_off, out_stride_v, m_a, m_off, vm_off, bias_a, bias_i, has_bias_v, res_a,
             res_off, activation_v, has_residual_v, in_step_v, out_step_v, segment_v,
             valid_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            inputs_base = e.base(0, in_a, in_off)
            filters_base = e.base(5, w_a, w_off)
            out_base = e.base(7, out_a, out_off)
            masks_base = e.base(10, m_a, m_off)
            vector_masks_base = e.base(10, m_a, vm_off)
            # Without a bias the bias operand is a one-element placeholder: its
            # element 0 is read (and not used), never the filter's index.
            bias_base = e.base(13, bias_a, b.select(has_bias_v, bias_i, e.constant(0)))
            residual_base = e.base(16, res_a, res_off)

            zero = ir.Constant(e.vector.element, 0.0)
            # Filter f's offsets from the first's (side by side; 0 for f = 0
            # and for a filter past valid_filters, whose lanes are masked off).
            real = [b.icmp_signed("<", e.constant(f), valid_v) for f in range(side)]

            def for_real(f, offset):
                return b.select(real[f], offset, e.constant(0)) if f else e.constant(0)

            taps = kernel_height * kernel_width
            weight_at = [for_real(f, e.constant(f * taps)) for f in range(side)]
            bias_at = [
                for_real(f, b.select(has_bias_v, e.constant(f), e.constant(0)))
                for f in range(side)
            ]
            lane_shift = [b.mul(segment_v, e.constant(f * stride_w)) for f in range(side)]
            plane_at = [
                for_real(f, b.sub(b.mul(in_step_v, e.constant(f)), lane_shift[f]))
                for f in range(side)
            ]
            out_at = [
                for_real(f, b.mul(b.sub(out_step_v, segment_v), e.constant(f)))
                for f in range(side)
            ]
            def filter_mask(masks_at, f, entry):
                """Filter ``f``'s mask ``entry`` (0: its stores, 1 + g*sw + h: its
                loads) of a vector's table at ``masks_at``: side by side, off for
                a filter past valid_filters."""
                if side == 1:
                    return e.bit_set_mask(masks_at, entry)
                return e.masked_by(e.bit_set_mask(masks_at, f * per_vector + entry), real[f])

            def at_filter(offset, f):
                """Output element ``offset`` of the first filter's plane, in filter ``f``'s."""
                return b.add(offset, out_at[f])

            # Filter f's lanes, [f*Q, (f+1)*Q): its store mask in the table; at
            # sw = 2 in the picks' order (lane i holds column picks[i] // 2),
            # which the sums keep until they are stored.
            filter_lanes = [filter_mask(masks_base, f, 0) for f in range(side)]
            if stride_w == 2:
                columns = ir.Constant(
                    ir.VectorType(I32, lanes),
                    [pick // 2 for pick in in_chunk_picks(lanes, e.element_bytes, 0)],
                )
                filter_lanes = [b.shuffle_vector(m, m, columns) for m in filter_lanes]

            def side_by_side(values):
                """One vector of ``values[f]`` in filter ``f``'s lanes."""
                merged = values[0]
                for f in range(1, side):
                    merged = b.select(filter_lanes[f], values[f], merged)
                return merged

            start = side_by_side(
                [
                    e.broadcast(b.select(has_bias_v, b.load(b.gep(bias_base, [at])), zero))
                    for at in bias_at
                ]
            )

            def weight(r, s):
                tap = e.constant(r * kernel_width + s)
                return side_by_side(
                    [e.broadcast(b.load(b.gep(filters_base, [b.add(at, tap)]))) for at in weight_at]
                )

            picks = {
                phase: ir.Constant(
                    ir.VectorType(I32, lanes), in_chunk_picks(lanes, e.element_bytes, phase)
                )
                for phase in range(stride_w)
            }
            natural = ir.Constant(
                ir.VectorType(I32, lanes), natural_order(lanes, e.element_bytes)
            )
            row_starts, on_plane_rows = {}, {}
            for i in sorted(served):
                on_plane_rows[i] = b.and_(
                    b.icmp_signed("<=", first_v, e.constant(i)),
                    b.icmp_signed(">", last_v, e.constant(i)),
                )
                row = b.gep(inputs_base, [b.mul(e.constant(i), width_v)])
                row_starts[i] = [b.gep(row, [plane_at[f]]) for f in range(side)]
            def only_on_plane(on_plane, body, sums):
                """``body()`` (which updates ``sums`` in place) where the
                window row is ``on_plane``, nothing where it is off: its taps
                would add only zeros.  Where the nest's block starts are
                constants, LLVM folds the branch and drops those rows."""
                before, entry = list(sums), b.basic_block
                taken = b.append_basic_block("row_taps.on_plane")
                joined = b.append_basic_block("row_taps.joined")
                b.cbranch(on_plane, taken, joined)
                b.position_at_end(taken)
                body()
                after = b.basic_block
                b.branch(joined)
                b.position_at_end(joined)
                for index, value in enumerate(sums):
                    if value is not before[index]:
                        merged = b.phi(value.type)
                        merged.add_incoming(before[index], entry)
                        merged.add_incoming(value, after)
                        sums[index] = merged

            # Each vector column of the block finished and stored before the
            # next: only its B chains of FMAs are live.  One chain of FMAs an
            # output vector (partial sums by filter row ran alike on the Xeon);
            # within a load group the window rows in order, so each output
            # sums its filter rows in order, masked or not.
            def emit_column(u, masked: bool, fused: bool, last: bool = False):
                """Vector column ``u`` (an i64) of the block, loaded and stored
                under its masks or whole, through the epilogue when ``fused``;
                ``last``: the row's last column (its ``tail_lanes``)."""
                column = b.mul(u, e.constant(lanes * stride_w))
                column_masks = b.gep(masks_base, [b.mul(u, e.constant(per_vector))])
                column_vector_masks = b.gep(
                    vector_masks_base, [b.mul(u, e.constant((per_vector - 1) * lanes))]
                )

                def load(rows_of, offset, g, h):
                    """The loaded vector of group ``g``'s half ``h`` at ``offset``
                    of the filters' rows ``rows_of`` (one a filter)."""
                    row = rows_of[0]
                    if not masked or (masked_fmas and whole_loads):
                        return e.load(row, offset)
                    if whole_loads:
                        lane_mask = e.lane_vector_mask(
                            column_vector_masks, (g * stride_w + h) * lanes
                        )
                        return e.zeroed_outside(e.load(row, offset), lane_mask)
                    merged = None
                    for f in range(side):
                        merged = e.load(rows_of[f], offset, load_masks[g, h][f], merged)
                    return merged

                # Each filter's load masks (its lanes only, side by side).
                load_masks = {
                    (g, h): [
                        filter_mask(column_masks, f, 1 + g * stride_w + h) for f in range(side)
                    ]
                    for g in range(len(groups))
                    for h in range(stride_w)
                }

                def union(masks):
                    combined = masks[0]
                    for mask in masks[1:]:
                        combined = b.or_(combined, mask)
                    return combined

                sums = [start] * rows
                for g, (offset, taps) in enumerate(groups.items()):
                    # The lanes a masked column's taps of this group add to, by
                    # phase: the load masks shuffled as the loaded halves are.
                    fma_masks = None
                    if masked and masked_fmas:
                        halves = [union(load_masks[g, h]) for h in range(stride_w)]
                        fma_masks = {
                            phase: halves[0]
                            if stride_w == 1
                            else b.shuffle_vector(halves[0], halves[1], picks[phase])
                            for _, phase in taps
                        }
                    # The group's taps' weights, broadcast here: R of them (2R
                    # at sw = 2) live beside the B sums, not all R*S.
                    weights = {
                        (r, s): weight(r, s) for s, _ in taps for r in range(kernel_height)
                    }
                    for i in sorted(served):

                        def window_row(i=i, g=g, offset=offset, taps=taps, fma_masks=fma_masks):
                            rows_of = [b.gep(start_f, [column]) for start_f in row_starts[i]]
                            loaded = [
                                load(rows_of, e.constant(offset + h * lanes), g, h)
                                for h in range(stride_w)
                            ]
                            for s, phase in taps:
                                value = (
                                    loaded[0]
                                    if stride_w == 1
                                    else b.shuffle_vector(loaded[0], loaded[1], picks[phase])
                                )
                                for out_row, r in served[i]:
                                    operands = (value, weights[r, s], sums[out_row])
                                    if fma_masks is None:
                                        sums[out_row] = b.call(e.fma, operands)
                                    else:
                                        sums[out_row] = e.masked_fma(
                                            *operands, fma_masks[phase]
                                        )

                        only_on_plane(on_plane_rows[i], window_row, sums)
                at_column = b.mul(u, e.constant(lanes))

                def at(out_row):
                    return b.add(b.mul(e.constant(out_row), out_stride_v), at_column)

                # Whole-load calls store whole, but for the row's last column's tail.
                store_masks = [None] * side
                if masked and (not whole_loads or (last and tail_lanes)):
                    store_masks = [filter_mask(column_masks, f, 0) for f in range(side)]

                def residual_of(out_row):
                    merged = None
                    for f in range(side):
                        at_f = at_filter(at(out_row), f)
                        merged = e.load(residual_base, at_f, store_masks[f], merged)
                    return merged

                if stride_w == 2:
                    sums = [b.shuffle_vector(value, value, natural) for value in sums]
                results = sums
                if fused:
                    results = emit_epilogue(b, sums, residual_of, activation_v, has_residual_v)
                for out_row, value in enumerate(results):
                    if whole_loads and last and tail_lanes:
                        address = b.gep(out_base, [at(out_row)])
                        store_leading_lanes(b, value, address, tail_lanes, e.element_bytes)
                    else:
                        for f in range(side):
                            e.store(value, out_base, at_filter(at(out_row), f), store_masks[f])

            def emit_columns(fused: bool):
                if unmasked_inner:
                    # The first and last vectors meet the row's edges; those
                    # between need no mask, so the columns are unrolled (a
                    # masked load cannot be folded into its FMA).  Unrolling U x
                    # B in general, LLVM spilled at sw = 2 from B*U = 8 on, and
                    # 16 x 4 blocks of 3x3 ran 1.3x slower than 4 x 4 on the
                    # Xeon: their code no longer fit the decoded-instruction
                    # cache; hence a loop otherwise.
                    emit_column(e.constant(0), True, fused)
                    for inner in range(1, vectors - 1):
                        emit_column(e.constant(inner), False, fused)
                    emit_column(e.constant(vectors - 1), True, fused, last=True)
                    return
                if whole_loads and tail_lanes:
                    # The last column stores its tail in plain pieces: apart.
                    if vectors > 1:
                        emit_column_loop(vectors - 1, fused)
                    emit_column(e.constant(vectors - 1), True, fused, last=True)
                    return
                emit_column_loop(vectors, fused)

            def emit_column_loop(count: int, fused: bool):
                entry = b.basic_block
                loop = b.append_basic_block("row_taps.column")
                done = b.append_basic_block("row_taps.done")
                b.branch(loop)
                b.position_at_end(loop)
                u = b.phi(e.intp)
                u.add_incoming(e.constant(0), entry)
                emit_column(u, True, fused)
                following = b.add(u, e.constant(1))
                u.add_incoming(following, b.basic_block)
                b.cbranch(b.icmp_signed("<", following, e.constant(count)), loop, done)
                b.position_at_end(done)

            # A call with no epilogue (no activation, no residual) takes columns
            # of their own, decided once a call: the epilogue's switch in every
            # column, and its code between them, cost 1.1x on dw 3x3 144 @56 at
            # two threads (Xeon).
            plain = b.and_(
                b.icmp_signed("==", activation_v, ir.Constant(activation_v.type, 0)),
                b.not_(has_residual_v),
            )
            with b.if_else(plain, likely=True) as (without, with_epilogue):
                with without:
                    emit_columns(False)
                with with_epilogue:
                    emit_columns(True)
            return context.get_dummy_value()

        return sig, codegen

    return row_tap_kernel
