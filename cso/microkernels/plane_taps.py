"""LLVM vector IR for stride-1 depthwise convolutions on unpacked planes.

Why no packing
--------------
At stride 1 with an output as wide as its input (``Q == W``), output pixel
``f = p*W + q`` of a plane reads tap ``(r, s)`` from input pixel ``f +
(r*dh - pad_top)*W + s*dw - pad_left`` of the flattened input plane: one
shift for every pixel.  A vector of ``VL`` consecutive output pixels is then
the sum of ``R*S`` vectors loaded straight from the input as given, each
times a broadcast tap, with the taps that fall off the plane masked to zero
(:func:`cso.analysis.planes.mask_table`).  No pass packs the input or
unpacks the output: the tap and lane kernels' packing is what a
memory-bound layer pays for.

Contract
--------
One call computes ``U`` (``vectors``) output vectors, pixels ``v0*VL ..
(v0+U)*VL`` of one plane::

    out[out_offset + u*VL + l] = bias + sum_{r < R, s < S}
        filters[w_offset + r*S + s]
        * (inputs[in_offset + u*VL + l + r*dh*width + s*dw]  where lane l of the tap's mask is set,
           else 0)

then the fused epilogue (:mod:`.epilogue`) in registers, the residual in
the output's layout (``residual_offset + u*VL + l``).  ``in_offset`` is the
plane's start plus ``v0*VL - pad_top*width - pad_left``: a checked call's
loads may start before the plane or end after it, but only the masked-in
lanes, which lie inside it, are read.  The masks are ``masks[mask_offset + u*E + e]`` (int32
bit sets of the lanes, ``E = 1 + S + R*S`` entries a vector): entry 0 the
stores, ``1 + s`` the taps of column ``s``, ``1 + S + r*S + s`` each tap.

* ``checked = False``: vectors whose every tap's every lane, masked or not,
  lies inside the plane (:func:`cso.analysis.planes.mask_table`), so the
  loads are whole; what the columns cut is zeroed by a bitwise and with
  ``masks[column_offset + (u*S + s)*VL + l]`` (all ones or zero, int32:
  :func:`cso.analysis.planes.column_table`), read once for the ``R`` rows
  of column ``s``; stores whole.  AVX2's masked loads are slow on AMD
  (Zen 3: this kernel ran 2.5x faster so on ``dw 3x3 144 @56``).
* ``checked = True, whole_edges = True`` (vectors at the top and bottom,
  and the plane's last, in a call whose loads all lie in the input: the
  nest checks): whole loads, each tap's cut lanes zeroed by an and with
  ``masks[column_offset + (u*R*S + r*S + s)*VL + l]``
  (:func:`cso.analysis.planes.edge_table`); whole stores, but for the
  plane's last vector where the call ``ends_plane``: its first
  ``tail_lanes`` in plain pieces.  A masked checked call had cost 280 ns
  on a Zen 3 against 15 for an unchecked one.
* ``checked = True`` otherwise (the calls at the very start and end of the
  input): every tap's own mask (masked loads), and masked stores.

Each output sums its taps column by column in the unchecked kernel (the
``R`` taps of a column apart, then added), row by row in the checked ones:
the two may round an output differently in the last bit.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..analysis.plane_shapes import MAX_PLANE_CALL_VECTORS
from .epilogue import emit_epilogue
from .vector_ir import (
    check_shape_bounds,
    KernelEmitter,
    check_bit_set_lanes,
    check_dtype_and_lanes,
    check_float_arrays,
    check_mask_table,
    store_leading_lanes,
)


def plane_kernel_signature(dtype_name: str, inputs, filters, masks, out, bias, residual):
    """At typing: check a plane kernel's arrays (this module's and
    :mod:`.whole_plane_taps`', one contract) and return its signature."""
    check_float_arrays(
        dtype_name, inputs=inputs, filters=filters, out=out, bias=bias, residual=residual
    )
    check_mask_table(masks)
    intp = types.intp
    return types.void(
        inputs, intp, intp, filters, intp, masks, intp, intp, types.boolean, out, intp,
        bias, intp, types.boolean, residual, intp, intp, types.boolean,
    )  # fmt: skip


@functools.lru_cache(maxsize=None)
def build_plane_tap_kernel(
    kernel_height: int, kernel_width: int, dilation_h: int, dilation_w: int, vectors: int,
    checked: bool, dtype_name: str, vector_lanes: int, whole_edges: bool = False,
    tail_lanes: int = 0,
):  # fmt: skip
    """Return a Numba intrinsic computing ``vectors`` output vectors of one plane.

    Parameters
    ----------
    kernel_height, kernel_width, dilation_h, dilation_w : int
        ``R``, ``S`` and the dilations: the taps are unrolled at generation.
    vectors : int
        Output vectors a call holds in registers (``U``).
    checked : bool
        Per-tap masks (see the module contract).
    whole_edges : bool
        With ``checked``: whole loads zeroed by an and with each tap's mask
        as a lane vector, and whole stores but for the plane's last vector's
        ``tail_lanes`` where the call ``ends_plane``; else masked loads and
        stores.
    tail_lanes : int
        With ``whole_edges``: the lanes of a plane's last vector
        (``P*Q mod VL``), 0 when it is whole.
    dtype_name : {"float32", "float64"}
    vector_lanes : int
        At most 32 (the masks are int32 bit sets).

    Returns
    -------
    intrinsic
        ``kernel(inputs, in_offset, width, filters, w_offset, masks,
        mask_offset, column_offset, ends_plane, out, out_offset, bias, bias_index, has_bias,
        residual, residual_offset, activation, has_residual)``.
    """
    check_dtype_and_lanes(dtype_name, vector_lanes)
    check_shape_bounds(
        ("kernel_height", kernel_height, 64), ("kernel_width", kernel_width, 64),
        ("dilation_h", dilation_h, 64), ("dilation_w", dilation_w, 64),
        ("vectors", vectors, MAX_PLANE_CALL_VECTORS),
    )  # fmt: skip
    check_bit_set_lanes(vector_lanes)
    if (
        not 0 <= tail_lanes < vector_lanes
        or (whole_edges and not checked)
        or (tail_lanes and not whole_edges)
    ):
        raise ValueError(
            "whole_edges and tail_lanes need checked, tail_lanes below vector_lanes "
            f"({vector_lanes}); got whole_edges={whole_edges}, tail_lanes={tail_lanes}"
        )
    lanes, taps = vector_lanes, kernel_height * kernel_width
    entries = 1 + kernel_width + taps

    @intrinsic
    def plane_tap_kernel(
        typingctx, inputs, in_offset, width, filters, w_offset, masks, mask_offset,
        column_offset, ends_plane, out, out_offset, bias, bias_index, has_bias, residual,
        residual_offset, activation, has_residual,
    ):  # fmt: skip
        sig = plane_kernel_signature(dtype_name, inputs, filters, masks, out, bias, residual)

        def codegen(context, builder, signature, args):
            (in_a, in_off, width_v, w_a, w_off, m_a, m_off, col_off, ends_plane_v, out_a,
             out_off, bias_a, bias_i, has_bias_v, res_a, res_off, activation_v,
             has_residual_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            inputs_base = e.base(0, in_a, in_off)
            filters_base = e.base(3, w_a, w_off)
            masks_base = e.base(5, m_a, m_off)
            columns_base = e.base(5, m_a, col_off)
            out_base = e.base(9, out_a, out_off)
            # Without a bias the bias operand is a one-element placeholder:
            # its element 0 is read (and not used), never the filter's index.
            bias_base = e.base(11, bias_a, b.select(has_bias_v, bias_i, e.constant(0)))
            residual_base = e.base(14, res_a, res_off)

            def mask(u, entry):
                return e.bit_set_mask(masks_base, u * entries + entry)

            zero = ir.Constant(e.vector.element, 0.0)
            start = e.broadcast(b.select(has_bias_v, b.load(bias_base), zero))
            sums = [start] * vectors
            # Where filter row r's taps start in the input, for both kinds of call.
            row_shifts = [b.mul(e.constant(r * dilation_h), width_v) for r in range(kernel_height)]
            if checked:
                weights = [
                    e.broadcast(b.load(b.gep(filters_base, [e.constant(t)]))) for t in range(taps)
                ]
                for r in range(kernel_height):
                    for s in range(kernel_width):
                        for u in range(vectors):
                            offset = b.add(row_shifts[r], e.constant(u * lanes + s * dilation_w))
                            if whole_edges:
                                tap_mask = e.lane_vector_mask(
                                    columns_base, (u * taps + r * kernel_width + s) * lanes
                                )
                                value = e.zeroed_outside(e.load(inputs_base, offset), tap_mask)
                            else:
                                tap_mask = mask(u, 1 + kernel_width + r * kernel_width + s)
                                value = e.load(inputs_base, offset, tap_mask)
                            sums[u] = b.call(e.fma, [value, weights[r * kernel_width + s], sums[u]])
            else:
                # Column by column, so that one column mask and its R taps are live at a
                # time, each column's R taps summed apart before joining the vector's sum:
                # chains of R FMAs, not R*S (four vectors' chains of nine dependent FMAs had
                # left the FMA pipes idle for their latency).
                for s in range(kernel_width):
                    column_taps = [
                        e.broadcast(b.load(b.gep(filters_base, [e.constant(r * kernel_width + s)])))
                        for r in range(kernel_height)
                    ]
                    for u in range(vectors):
                        column = e.lane_vector_mask(columns_base, (u * kernel_width + s) * lanes)
                        partial = None
                        for r in range(kernel_height):
                            offset = b.add(row_shifts[r], e.constant(u * lanes + s * dilation_w))
                            value = e.zeroed_outside(e.load(inputs_base, offset), column)
                            partial = (
                                b.fmul(value, column_taps[r])
                                if partial is None
                                else b.call(e.fma, [value, column_taps[r], partial])
                            )
                        sums[u] = b.fadd(sums[u], partial)

            masked_stores = checked and not whole_edges

            def store_mask(u):
                return mask(u, 0) if masked_stores else None

            def residual_of(u):
                return e.load(residual_base, e.constant(u * lanes), store_mask(u))

            if not tail_lanes:
                sums = emit_epilogue(b, sums, residual_of, activation_v, has_residual_v)
                for u, value in enumerate(sums):
                    e.store(value, out_base, e.constant(u * lanes), store_mask(u))
                return context.get_dummy_value()
            # The plane's last vector, where the call ends the plane: its first tail_lanes.
            head = emit_epilogue(b, sums[:-1], residual_of, activation_v, has_residual_v)
            for u, value in enumerate(head):
                e.store(value, out_base, e.constant(u * lanes))
            last = vectors - 1
            at = e.constant(last * lanes)
            with b.if_else(ends_plane_v) as (tail, whole):
                with tail:
                    (value,) = emit_epilogue(
                        b, [sums[last]], lambda _: e.load(residual_base, at, mask(last, 0)),
                        activation_v, has_residual_v,
                    )  # fmt: skip
                    address = b.gep(out_base, [at])
                    store_leading_lanes(b, value, address, tail_lanes, e.element_bytes)
                with whole:
                    (value,) = emit_epilogue(
                        b, [sums[last]], lambda _: e.load(residual_base, at), activation_v,
                        has_residual_v,
                    )  # fmt: skip
                    e.store(value, out_base, at)
            return context.get_dummy_value()

        return sig, codegen

    return plane_tap_kernel
