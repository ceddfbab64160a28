"""LLVM vector IR for depthwise convolutions with channels in the vector lanes.

Why channels in lanes
---------------------
The tap kernel (:mod:`.taps`) holds output rows in its vectors: a plane
narrower than a vector (7 or 14 wide against 16 lanes) pads most lanes,
and each channel of a small plane pays a packing pass and a kernel call
for little work (on a Xeon, EfficientNet-B0's ``dw 5x5 1152 @7`` ran at
10% of the FMA peak that way).  Here a vector holds one pixel of ``VL``
channels: every tap of every stride and dilation is a whole-vector load,
no lane is padding while there are ``VL`` channels left, and one call
computes a run of pixels for ``VL`` channels at once.  Three kernels:

* :func:`~.lane_transposes.build_lane_pack`: ``VL`` channel planes to
  pixel vectors (an in-register transpose of ``VL x VL`` tiles,
  :func:`.vector_ir.transpose`), into a zero-padded plane; it also lays
  out the filters, whose ``R*S`` taps are a plane of one row.
* :func:`build_lane_tap_kernel` (here): ``outputs`` pixels of one output
  row, all taps, in registers; each input vector loaded once feeds every
  output it reaches, with the current filter row's ``S`` tap vectors held.
* :func:`~.lane_transposes.build_lane_unpack`: pixel vectors back to
  channel planes (the transpose again), with the fused epilogue
  (:mod:`.epilogue`) applied.

Packed-layout contract
----------------------
For a block of ``VL`` channels ``k0 + l`` of one image, with ``valid``
of them real (``l >= valid`` are zeros, never stored)::

    packed[((i * pitch) + j) * VL + l] = x[k0 + l][i - pad_top][j - pad_left]   (0 outside)
    filters[t * VL + l]               = w[k0 + l][0][r][s]                      (t = r*S + s)
    staged[(p * Q + q) * VL + l]      = y[k0 + l][p][q] before the epilogue

and the tap kernel computes, for ``q < outputs``::

    out[out_offset + q*VL + l] = bias[k0 + l]
        + sum_{r < R, s < S} filters[w_offset + (r*S + s)*VL + l]
                             * inputs[in_offset + r*row_step + (q*stride_w + s*dilation_w)*VL + l]

The loop nest (:mod:`cso.macrokernel.lanes`) keeps every load in bounds:
the packed plane covers every tap of every output, and the staging area
has ``VL`` pixel vectors to spare after its last pixel.
"""

from __future__ import annotations

import functools

from numba import types
from numba.extending import intrinsic

from .vector_ir import (
    KernelEmitter,
    check_dtype_and_lanes,
    check_float_arrays,
    check_shape_bounds,
)


def column_uses(outputs: int, kernel_width: int, stride_w: int, dilation_w: int) -> list:
    """For each input column ``c`` a run of ``outputs`` pixels reads, the
    ``(q, s)`` it feeds: ``q * stride_w + s * dilation_w == c``."""
    width = (outputs - 1) * stride_w + (kernel_width - 1) * dilation_w + 1
    uses = [[] for _ in range(width)]
    for q in range(outputs):
        for s in range(kernel_width):
            uses[q * stride_w + s * dilation_w].append((q, s))
    return uses


@functools.lru_cache(maxsize=None)
def build_lane_tap_kernel(
    kernel_width: int, stride_w: int, dilation_w: int, outputs: int, dtype_name: str,
    vector_lanes: int,
):  # fmt: skip
    """Return a Numba intrinsic computing ``outputs`` pixels of ``VL`` channels.

    Parameters
    ----------
    kernel_width, stride_w, dilation_w : int
        ``S`` and the horizontal stride and dilation: which input column
        feeds which output is unrolled at generation.
    outputs : int
        Pixels of one output row held in registers, each a vector of ``VL``
        channels.
    dtype_name : {"float32", "float64"}
    vector_lanes : int

    Returns
    -------
    intrinsic
        ``kernel(kernel_height, filters, w_offset, inputs, in_offset,
        row_step, out, out_offset, bias, bias_offset, valid, has_bias)``
        (see the module contract); the bias of lanes ``l < valid`` is
        ``bias[bias_offset + l]`` when ``has_bias``, else 0.
    """
    check_dtype_and_lanes(dtype_name, vector_lanes)
    check_shape_bounds(
        ("kernel_width", kernel_width, 32), ("stride_w", stride_w, 16),
        ("dilation_w", dilation_w, 16), ("outputs", outputs, 64),
    )  # fmt: skip
    lanes = vector_lanes
    uses = column_uses(outputs, kernel_width, stride_w, dilation_w)

    @intrinsic
    def lane_tap_kernel(
        typingctx, kernel_height, filters, w_offset, inputs, in_offset, row_step, out,
        out_offset, bias, bias_offset, valid, has_bias,
    ):  # fmt: skip
        check_float_arrays(dtype_name, filters=filters, inputs=inputs, out=out, bias=bias)
        intp = types.intp
        sig = types.void(
            intp, filters, intp, inputs, intp, intp, out, intp, bias, intp, intp, types.boolean
        )

        def codegen(context, builder, signature, args):
            (height_v, w_a, w_off, in_a, in_off, step_v, out_a, out_off, bias_a, bias_off,
             valid_v, has_bias_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            filters_base = e.base(1, w_a, w_off)
            inputs_base = e.base(3, in_a, in_off)
            out_base = e.base(6, out_a, out_off)
            bias_base = e.base(8, bias_a, bias_off)
            biased = e.masked_by(e.lanes_below(valid_v), has_bias_v)
            start = e.load(bias_base, e.constant(0), biased)

            # for r in range(R): the S tap vectors of filter row r, then each
            # input vector of the row loaded once and fed to every output it reaches.
            entry = b.basic_block
            loop = b.append_basic_block("rows.loop")
            done = b.append_basic_block("rows.done")
            b.cbranch(b.icmp_signed(">", height_v, e.constant(0)), loop, done)
            b.position_at_end(loop)
            r = b.phi(e.intp)
            r.add_incoming(e.constant(0), entry)
            accumulators = []
            for _ in range(outputs):
                phi = b.phi(e.vector)
                phi.add_incoming(start, entry)
                accumulators.append(phi)
            tap_row = b.mul(r, e.constant(kernel_width * lanes))
            taps = [
                e.load(filters_base, b.add(tap_row, e.constant(s * lanes)))
                for s in range(kernel_width)
            ]  # fmt: skip
            row = b.mul(r, step_v)
            updated = list(accumulators)
            for c, feeds in enumerate(uses):
                if not feeds:
                    continue
                value = e.load(inputs_base, b.add(row, e.constant(c * lanes)))
                for q, s in feeds:
                    updated[q] = b.call(e.fma, [taps[s], value, updated[q]])
            following = b.add(r, e.constant(1))
            r.add_incoming(following, loop)
            for phi, value in zip(accumulators, updated):
                phi.add_incoming(value, loop)
            b.cbranch(b.icmp_signed("<", following, height_v), loop, done)
            b.position_at_end(done)
            results = []
            for q in range(outputs):
                phi = b.phi(e.vector)
                phi.add_incoming(start, entry)
                phi.add_incoming(updated[q], loop)
                results.append(phi)
            for q, value in enumerate(results):
                e.store(value, out_base, e.constant(q * lanes))
            return context.get_dummy_value()

        return sig, codegen

    return lane_tap_kernel
