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
``(p*sh - pad_top)*width + q0*sw - pad_left``), and at
``zeros[zeros_offset]`` for the other rows, which fall off the plane: the
same column masks then read zeros (the caller passes the offset at which a
row of ``width`` zeros, starting ``q0*sw - pad_left`` elements later, has
its columns).  Loads may start before a row or end after it; only the
masked-in lanes, inside ``[0, width)`` of the row, are read.

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


# The chunk of a vector register within which one shuffle instruction of two
# sources moves elements (x86's 128-bit lanes; all of a NEON register).
SHUFFLE_CHUNK_BYTES = 16


def in_chunk_picks(lanes: int, element_bytes: int, phase: int) -> list:
    """The ``phase``-th of every 2 elements of two concatenated vectors
    ``(a, b)``, in the order one in-chunk shuffle gives them.

    Chunk ``k`` of the result (``E = 16 / element_bytes`` elements) holds
    ``a``'s picks from its chunk ``k``, then ``b``'s: ``[a0 a2 b0 b2 | a4 a6
    b4 b6]`` for 8 floats, one ``vshufps``, where the natural order ``[a0 a2
    a4 a6 b0 b2 b4 b6]`` takes a ``vshufps`` and a cross-chunk permute.
    Every tap's vector comes out in this same order, so the sums do too and
    :func:`natural_order` puts them back once, before they are stored: on an
    AMD EPYC (Zen 3) stride-2 row layers ran 1.11-1.16x faster so (``dw
    3x3/2`` at 96 channels @112, 144 @56 and 8 @112, against the natural
    order's two instructions a tap, in paired rounds of one process).
    """
    chunk = max(1, SHUFFLE_CHUNK_BYTES // element_bytes)
    if lanes <= chunk:
        return [phase + 2 * i for i in range(lanes)]
    half = chunk // 2
    picks = []
    for position in range(lanes):
        k, j = divmod(position, chunk)
        source = k * chunk + 2 * j if j < half else lanes + k * chunk + 2 * (j - half)
        picks.append(source + phase)
    return picks


def natural_order(lanes: int, element_bytes: int) -> list:
    """The shuffle putting a vector in :func:`in_chunk_picks`' order back in
    output-column order: element ``q`` is taken from the position holding
    output column ``q``."""
    # Pick 2m of the concatenated pair (a's m-th pair, or b's) is column m.
    columns = [pick // 2 for pick in in_chunk_picks(lanes, element_bytes, 0)]
    return [columns.index(q) for q in range(lanes)]


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
    masked_fmas: bool = False,
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

    Returns
    -------
    intrinsic
        ``kernel(inputs, in_offset, width, zeros, zeros_offset, i_first, i_last, filters,
        w_offset, out, out_offset, out_stride, masks, mask_offset, vector_mask_offset,
        bias, bias_index, has_bias, residual, residual_offset, activation, has_residual)``.
    """
    check_dtype_and_lanes(dtype_name, vector_lanes)
    check_shape_bounds(
        ("kernel_height", kernel_height, 64), ("kernel_width", kernel_width, 64),
        ("dilation_h", dilation_h, 64), ("dilation_w", dilation_w, 64),
        ("stride_h", stride_h, 64), ("stride_w", stride_w, 2), ("rows", rows, 32),
        ("vectors", vectors, 32),
    )  # fmt: skip
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
        typingctx, inputs, in_offset, width, zeros, zeros_offset, i_first, i_last, filters,
        w_offset, out, out_offset, out_stride, masks, mask_offset, vector_mask_offset, bias,
        bias_index, has_bias, residual, residual_offset, activation, has_residual,
    ):  # fmt: skip
        check_float_arrays(
            dtype_name, inputs=inputs, zeros=zeros, filters=filters, out=out, bias=bias,
            residual=residual,
        )  # fmt: skip
        check_mask_table(masks)
        intp = types.intp
        sig = types.void(
            inputs, intp, intp, zeros, intp, intp, intp, filters, intp, out, intp, intp, masks,
            intp, intp, bias, intp, types.boolean, residual, intp, intp, types.boolean,
        )  # fmt: skip

        def codegen(context, builder, signature, args):
            (in_a, in_off, width_v, zeros_a, zeros_off, first_v, last_v, w_a, w_off, out_a,
             out_off, out_stride_v, m_a, m_off, vm_off, bias_a, bias_i, has_bias_v, res_a,
             res_off, activation_v, has_residual_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            inputs_base = e.base(0, in_a, in_off)
            zeros_base = e.base(3, zeros_a, zeros_off)
            filters_base = e.base(7, w_a, w_off)
            out_base = e.base(9, out_a, out_off)
            masks_base = e.base(12, m_a, m_off)
            vector_masks_base = e.base(12, m_a, vm_off)
            bias_base = e.base(15, bias_a, bias_i)
            residual_base = e.base(18, res_a, res_off)

            zero = ir.Constant(e.vector.element, 0.0)
            start = e.broadcast(b.select(has_bias_v, b.load(bias_base), zero))

            def weight(r, s):
                return e.broadcast(
                    b.load(b.gep(filters_base, [e.constant(r * kernel_width + s)]))
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
            row_starts = {}
            for i in sorted(served):
                on_plane = b.and_(
                    b.icmp_signed("<=", first_v, e.constant(i)),
                    b.icmp_signed(">", last_v, e.constant(i)),
                )
                row = b.gep(inputs_base, [b.mul(e.constant(i), width_v)])
                row_starts[i] = b.select(on_plane, row, zeros_base)
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

                def load(row, offset, g, h):
                    """The loaded vector of group ``g``'s half ``h`` at ``offset``."""
                    if not masked or (masked_fmas and whole_loads):
                        return e.load(row, offset)
                    if whole_loads:
                        lane_mask = e.lane_vector_mask(
                            column_vector_masks, (g * stride_w + h) * lanes
                        )
                        return e.zeroed_outside(e.load(row, offset), lane_mask)
                    return e.load(
                        row, offset, e.bit_set_mask(column_masks, 1 + g * stride_w + h)
                    )

                sums = [start] * rows
                for g, (offset, taps) in enumerate(groups.items()):
                    # The lanes a masked column's taps of this group add to, by
                    # phase: the load masks shuffled as the loaded halves are.
                    fma_masks = None
                    if masked and masked_fmas:
                        halves = [
                            e.bit_set_mask(column_masks, 1 + g * stride_w + h)
                            for h in range(stride_w)
                        ]
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
                        row = b.gep(row_starts[i], [column])
                        loaded = [
                            load(row, e.constant(offset + h * lanes), g, h)
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
                                    sums[out_row] = e.masked_fma(*operands, fma_masks[phase])
                at_column = b.mul(u, e.constant(lanes))

                def at(out_row):
                    return b.add(b.mul(e.constant(out_row), out_stride_v), at_column)

                # Whole-load calls store whole, but for the row's last column's tail.
                store_mask = None
                if masked and (not whole_loads or (last and tail_lanes)):
                    store_mask = e.bit_set_mask(column_masks, 0)

                def residual_of(out_row):
                    return e.load(residual_base, at(out_row), store_mask)

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
                        e.store(value, out_base, at(out_row), store_mask)

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
