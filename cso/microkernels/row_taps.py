"""LLVM vector IR for depthwise convolutions on unpacked planes, a run of one
output row at a time, at horizontal stride 1 or 2.

Contract
--------
One call computes ``U`` (``vectors``) vectors of consecutive outputs ``q =
q0 + u*VL + l`` of one output row ``p`` of one plane::

    out[out_offset + u*VL + l] = bias + sum_{r < R, s < S} filters[w_offset + r*S + s]
        * row_r[(u*VL + l)*sw + s*dw]       (0 where the column mask is clear)

then the fused epilogue (:mod:`.epilogue`) in registers, the residual in
the output's layout (``residual_offset + u*VL + l``).  ``row_r`` starts at
``inputs[in_offset + r*dh*width]`` for ``r_first <= r < r_last`` (the
caller passes ``in_offset`` = the plane's start plus ``(p*sh -
pad_top)*width + q0*sw - pad_left``), and at ``zeros[zeros_offset]`` for
the other rows, which fall off the plane: the same column masks then read
zeros (the caller passes the offset at which a row of ``width`` zeros,
starting ``q0*sw - pad_left`` elements later, has its columns).  Loads may start before a row
or end after it; only the masked-in lanes, inside ``[0, width)`` of the
row, are read.

The taps of a filter row are grouped by :func:`cso.analysis.rows.load_groups`:
group ``e`` loads the ``sw`` vectors from column offset ``e`` once and each
of its taps takes the ``phase``-th of every ``sw`` elements (one
two-source shuffle at ``sw = 2``; the loaded vector itself at ``sw = 1``).
The masks are ``masks[mask_offset + u*(1 + G*sw) + i]`` (int32 bit sets):
``i = 0`` the stores, ``1 + g*sw + h`` the loads of group ``g``'s half ``h``.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..analysis.rows import load_groups
from .epilogue import emit_epilogue
from .vector_ir import (
    check_shape_bounds,
    I32,
    KernelEmitter,
    check_bit_set_lanes,
    check_dtype_and_lanes,
    check_float_arrays,
    check_mask_table,
)


@functools.lru_cache(maxsize=None)
def build_row_tap_kernel(
    kernel_height: int, kernel_width: int, dilation_h: int, dilation_w: int, stride_w: int,
    vectors: int, dtype_name: str, vector_lanes: int,
):  # fmt: skip
    """Return a Numba intrinsic computing ``vectors`` output vectors of one output row.

    Parameters
    ----------
    kernel_height, kernel_width, dilation_h, dilation_w : int
        ``R``, ``S`` and the dilations: the taps are unrolled at generation.
    stride_w : {1, 2}
        The horizontal stride.
    vectors : int
        Output vectors a call holds in registers (``U``).
    dtype_name : {"float32", "float64"}
    vector_lanes : int
        At most 32 (the masks are int32 bit sets).

    Returns
    -------
    intrinsic
        ``kernel(inputs, in_offset, width, zeros, zeros_offset, r_first, r_last, filters,
        w_offset, out, out_offset, masks, mask_offset, bias, bias_index,
        has_bias, residual, residual_offset, activation, has_residual)``.
    """
    check_dtype_and_lanes(dtype_name, vector_lanes)
    check_shape_bounds(
        ("kernel_height", kernel_height, 64), ("kernel_width", kernel_width, 64),
        ("dilation_h", dilation_h, 64), ("dilation_w", dilation_w, 64), ("stride_w", stride_w, 2),
        ("vectors", vectors, 32),
    )  # fmt: skip
    check_bit_set_lanes(vector_lanes)
    lanes = vector_lanes
    groups = load_groups(kernel_width, dilation_w, stride_w)
    per_vector = 1 + len(groups) * stride_w

    @intrinsic
    def row_tap_kernel(
        typingctx, inputs, in_offset, width, zeros, zeros_offset, r_first, r_last, filters,
        w_offset, out,
        out_offset, masks, mask_offset, bias, bias_index, has_bias, residual, residual_offset,
        activation, has_residual,
    ):  # fmt: skip
        check_float_arrays(
            dtype_name, inputs=inputs, zeros=zeros, filters=filters, out=out, bias=bias,
            residual=residual,
        )  # fmt: skip
        check_mask_table(masks)
        intp = types.intp
        sig = types.void(
            inputs, intp, intp, zeros, intp, intp, intp, filters, intp, out, intp, masks, intp,
            bias, intp, types.boolean, residual, intp, intp, types.boolean,
        )  # fmt: skip

        def codegen(context, builder, signature, args):
            (in_a, in_off, width_v, zeros_a, zeros_off, first_v, last_v, w_a, w_off, out_a, out_off,
             m_a, m_off, bias_a, bias_i, has_bias_v, res_a, res_off, activation_v,
             has_residual_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            inputs_base = e.base(0, in_a, in_off)
            zeros_base = e.base(3, zeros_a, zeros_off)
            filters_base = e.base(7, w_a, w_off)
            out_base = e.base(9, out_a, out_off)
            masks_base = e.base(11, m_a, m_off)
            bias_base = e.base(13, bias_a, bias_i)
            residual_base = e.base(16, res_a, res_off)

            def mask(index):
                return e.bit_set_mask(masks_base, index)

            zero = ir.Constant(e.vector.element, 0.0)
            start = e.broadcast(b.select(has_bias_v, b.load(bias_base), zero))
            weights = [
                e.broadcast(b.load(b.gep(filters_base, [e.constant(t)])))
                for t in range(kernel_height * kernel_width)
            ]
            load_masks = {
                (u, g, h): mask(u * per_vector + 1 + g * stride_w + h)
                for u in range(vectors)
                for g in range(len(groups))
                for h in range(stride_w)
            }
            picks = {
                phase: ir.Constant(
                    ir.VectorType(I32, lanes), [phase + stride_w * i for i in range(lanes)]
                )
                for phase in range(stride_w)
            }
            # One chain of FMAs a vector: partial sums by filter row ran alike on
            # the Xeon (U = 1 rows of 7 and 14 outputs, U = 4 of 56).
            sums = [start] * vectors
            for r in range(kernel_height):
                on_plane = b.and_(
                    b.icmp_signed("<=", first_v, e.constant(r)),
                    b.icmp_signed(">", last_v, e.constant(r)),
                )
                row = b.gep(inputs_base, [b.mul(e.constant(r * dilation_h), width_v)])
                row = b.select(on_plane, row, zeros_base)
                for u in range(vectors):
                    for g, (offset, taps) in enumerate(groups.items()):
                        loaded = [
                            e.load(
                                row,
                                e.constant(u * lanes * stride_w + offset + h * lanes),
                                load_masks[u, g, h],
                            )
                            for h in range(stride_w)
                        ]
                        for s, phase in taps:
                            value = (
                                loaded[0]
                                if stride_w == 1
                                else b.shuffle_vector(loaded[0], loaded[1], picks[phase])
                            )
                            sums[u] = b.call(
                                e.fma, [value, weights[r * kernel_width + s], sums[u]]
                            )

            def residual_of(u):
                return e.load(residual_base, e.constant(u * lanes), mask(u * per_vector))

            sums = emit_epilogue(b, sums, residual_of, activation_v, has_residual_v)
            for u, value in enumerate(sums):
                e.store(value, out_base, e.constant(u * lanes), mask(u * per_vector))
            return context.get_dummy_value()

        return sig, codegen

    return row_tap_kernel
