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

* :func:`build_lane_pack`: ``VL`` channel planes to pixel vectors (an
  in-register transpose of ``VL x VL`` tiles, :func:`.vector_ir.transpose`),
  into a zero-padded plane;
  it also lays out the filters, whose ``R*S`` taps are a plane of one row.
* :func:`build_lane_tap_kernel`: ``outputs`` pixels of one output row,
  all taps, in registers; each input vector loaded once feeds every output
  it reaches, with the current filter row's ``S`` tap vectors held.
* :func:`build_lane_unpack`: pixel vectors back to channel planes (the
  transpose again), with the fused epilogue (:mod:`.epilogue`) applied.

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

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .epilogue import emit_epilogue
from .vector_ir import (
    I32,
    check_float_arrays,
    fma_function,
    lanes_below,
    masked_load_function,
    masked_store_function,
    transpose,
    vector_type,
)

_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}

# How far ahead of its stores a whole unpack prefetches each channel's output
# for writing: two 64-byte lines.  Its 16 stores a tile go to 16 channel
# planes, each store's line missing L1, and the hardware prefetchers do not
# fetch lines for stores: on a Xeon (Sapphire Rapids) 16 x 16 float32 tiles
# into planes resident in L2 took 102-131 cycles a tile without, 68-74 with
# the prefetch two lines ahead (four lines ahead: 68-108, eight: 82-135).
UNPACK_PREFETCH_BYTES = 128


def column_uses(outputs: int, kernel_width: int, stride_w: int, dilation_w: int) -> list:
    """For each input column ``c`` a run of ``outputs`` pixels reads, the
    ``(q, s)`` it feeds: ``q * stride_w + s * dilation_w == c``."""
    width = (outputs - 1) * stride_w + (kernel_width - 1) * dilation_w + 1
    uses = [[] for _ in range(width)]
    for q in range(outputs):
        for s in range(kernel_width):
            uses[q * stride_w + s * dilation_w].append((q, s))
    return uses


class _Emitter:
    """What the three kernels build alike: the operands' pointers, masks and
    whole or masked vector loads and stores (:mod:`.vector_ir`)."""

    def __init__(self, context, builder, signature, dtype_name, lanes):
        self.context, self.builder, self.signature, self.lanes = context, builder, signature, lanes
        self.intp = context.get_value_type(types.intp)
        self.vector = vector_type(dtype_name, lanes)
        self.align = self.element_bytes = 4 if dtype_name == "float32" else 8
        self.mask_type = ir.VectorType(ir.IntType(1), lanes)
        self.fma = fma_function(builder.module, self.vector)
        self.masked_load = masked_load_function(builder.module, self.vector)
        self.masked_store = masked_store_function(builder.module, self.vector)
        self.zero = ir.Constant(self.vector, [0.0] * lanes)
        self.prefetch = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] + [I32] * 3),
            "llvm.prefetch.p0",
        )

    def constant(self, value):
        return ir.Constant(self.intp, value)

    def base(self, index, array, offset):
        """A pointer to element ``offset`` of the kernel's array argument ``index``."""
        data = self.context.make_array(self.signature.args[index])(
            self.context, self.builder, array
        ).data
        return self.builder.gep(data, [offset])

    def vector_at(self, base, offset):
        return self.builder.bitcast(self.builder.gep(base, [offset]), self.vector.as_pointer())

    def lanes_below(self, count):
        """The mask of lanes ``j < count``."""
        return lanes_below(self.builder, count, self.lanes)

    def masked_by(self, mask, condition):
        """``mask`` where the run-time ``condition`` holds, else no lane."""
        every = ir.Constant(self.mask_type, [1] * self.lanes)
        none = ir.Constant(self.mask_type, [0] * self.lanes)
        return self.builder.and_(mask, self.builder.select(condition, every, none))

    def prefetch_for_store(self, base, offset):
        """``llvm.prefetch`` of element ``offset`` of ``base`` for writing,
        into every cache level."""
        address = self.builder.bitcast(
            self.builder.gep(base, [offset]), ir.IntType(8).as_pointer()
        )
        self.builder.call(
            self.prefetch, [address, ir.Constant(I32, 1), ir.Constant(I32, 3), ir.Constant(I32, 1)]
        )

    def load(self, base, offset, mask):
        return self.builder.call(
            self.masked_load,
            [self.vector_at(base, offset), ir.Constant(I32, self.align), mask, self.zero],
        )

    def store(self, value, base, offset, mask):
        self.builder.call(
            self.masked_store,
            [value, self.vector_at(base, offset), ir.Constant(I32, self.align), mask],
        )


def _check(dtype_name, lanes):
    if dtype_name not in _NUMBA_FLOAT:
        raise ValueError(f"dtype_name must be float32 or float64, got {dtype_name!r}")
    if lanes < 2 or lanes > 64 or lanes & (lanes - 1):
        raise ValueError(f"vector_lanes must be a power of two in [2, 64], got {lanes}")


@functools.lru_cache(maxsize=None)
def build_lane_pack(dtype_name: str, vector_lanes: int):
    """Return a Numba intrinsic laying ``VL`` channel planes out as pixel vectors.

    ``lane_pack(src, src_offset, plane, count, valid, dst, targets, index)``:
    for pixels ``i < count`` (at most ``VL``) of the channel planes
    ``src[src_offset + l*plane:]``, ``l < VL``, the vector of their ``VL``
    values (zero for ``l >= valid``) is stored at ``dst[targets[index +
    i]]``: ``targets`` (intp) says where each pixel goes, so that a run of
    ``VL`` pixels may wrap from one padded row to the next with no
    arithmetic per pixel.  A whole block (``count == valid == VL``) is
    loaded and stored with no masks and no branches.
    """
    _check(dtype_name, vector_lanes)
    lanes = vector_lanes

    @intrinsic
    def lane_pack(typingctx, src, src_offset, plane, count, valid, dst, targets, index):
        check_float_arrays(dtype_name, src=src, dst=dst)
        intp = types.intp
        if not (isinstance(targets, types.Array) and targets.dtype == intp and targets.ndim == 1):
            raise TypeError(f"targets must be a 1-D intp array, got {targets}")
        sig = types.void(src, intp, intp, intp, intp, dst, targets, intp)

        def codegen(context, builder, signature, args):
            src_a, src_off, plane_v, count_v, valid_v, dst_a, targets_a, index_v = args
            e = _Emitter(context, builder, signature, dtype_name, lanes)
            b = builder
            src_base = e.base(0, src_a, src_off)
            dst_base = e.base(5, dst_a, e.constant(0))
            targets_base = e.base(6, targets_a, index_v)
            sources = [b.mul(e.constant(channel), plane_v) for channel in range(lanes)]

            def target(i):
                return b.load(b.gep(targets_base, [e.constant(i)]))

            whole = b.and_(
                b.icmp_signed("==", count_v, e.constant(lanes)),
                b.icmp_signed("==", valid_v, e.constant(lanes)),
            )
            with b.if_else(whole, likely=True) as (then, otherwise):
                with then:
                    rows = [
                        b.load(e.vector_at(src_base, offset), align=e.align) for offset in sources
                    ]
                    for i, value in enumerate(transpose(b, rows)):
                        b.store(value, e.vector_at(dst_base, target(i)), align=e.align)
                with otherwise:
                    pixels = e.lanes_below(count_v)
                    rows = []
                    for channel, offset in enumerate(sources):
                        real = b.icmp_signed("<", e.constant(channel), valid_v)
                        rows.append(e.load(src_base, offset, e.masked_by(pixels, real)))
                    pixel_vectors = transpose(b, rows)
                    done = b.append_basic_block("pack.done")
                    for i, value in enumerate(pixel_vectors):
                        store = b.append_basic_block(f"pack.store{i}")
                        b.cbranch(b.icmp_signed("<", e.constant(i), count_v), store, done)
                        b.position_at_end(store)
                        b.store(value, e.vector_at(dst_base, target(i)), align=e.align)
                    b.branch(done)
                    b.position_at_end(done)
            return context.get_dummy_value()

        return sig, codegen

    return lane_pack


@functools.lru_cache(maxsize=None)
def build_lane_unpack(dtype_name: str, vector_lanes: int):
    """Return a Numba intrinsic writing pixel vectors back as channel planes.

    ``lane_unpack(src, src_offset, count, valid, dst, dst_offset, plane,
    residual, activation, has_residual)``: for channels ``l < valid`` and
    pixels ``i < count``, ``dst[dst_offset + l*plane + i] =
    act(src[src_offset + i*VL + l] + residual[same index])`` (the residual
    only when ``has_residual``; :mod:`.epilogue`).  ``src`` must hold ``VL``
    pixel vectors from ``src_offset``, whatever ``count``.
    """
    _check(dtype_name, vector_lanes)
    lanes = vector_lanes

    @intrinsic
    def lane_unpack(
        typingctx, src, src_offset, count, valid, dst, dst_offset, plane, residual, activation,
        has_residual,
    ):  # fmt: skip
        check_float_arrays(dtype_name, src=src, dst=dst, residual=residual)
        intp = types.intp
        sig = types.void(src, intp, intp, intp, dst, intp, intp, residual, intp, types.boolean)

        def codegen(context, builder, signature, args):
            (src_a, src_off, count_v, valid_v, dst_a, dst_off, plane_v, res_a, activation_v,
             has_residual_v) = args  # fmt: skip
            e = _Emitter(context, builder, signature, dtype_name, lanes)
            b = builder
            src_base = e.base(0, src_a, src_off)
            dst_base = e.base(4, dst_a, dst_off)
            res_base = e.base(7, res_a, dst_off)
            offsets = [b.mul(e.constant(channel), plane_v) for channel in range(lanes)]
            ahead = e.constant(UNPACK_PREFETCH_BYTES // e.element_bytes)

            def channels():
                pixels = [
                    b.load(e.vector_at(src_base, e.constant(i * lanes)), align=e.align)
                    for i in range(lanes)
                ]
                return transpose(b, pixels)

            whole = b.and_(
                b.icmp_signed("==", count_v, e.constant(lanes)),
                b.icmp_signed("==", valid_v, e.constant(lanes)),
            )
            with b.if_else(whole, likely=True) as (then, otherwise):
                with then:
                    results = emit_epilogue(
                        b,
                        channels(),
                        lambda index: b.load(
                            e.vector_at(res_base, offsets[index]), align=e.align
                        ),
                        activation_v,
                        has_residual_v,
                    )
                    for offset in offsets:
                        e.prefetch_for_store(dst_base, b.add(offset, ahead))
                    for value, offset in zip(results, offsets):
                        b.store(value, e.vector_at(dst_base, offset), align=e.align)
                with otherwise:
                    in_run = e.lanes_below(count_v)
                    masks = [
                        e.masked_by(in_run, b.icmp_signed("<", e.constant(channel), valid_v))
                        for channel in range(lanes)
                    ]
                    results = emit_epilogue(
                        b,
                        channels(),
                        lambda index: e.load(res_base, offsets[index], masks[index]),
                        activation_v,
                        has_residual_v,
                    )
                    for value, offset, mask in zip(results, offsets, masks):
                        e.store(value, dst_base, offset, mask)
            return context.get_dummy_value()

        return sig, codegen

    return lane_unpack


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
    _check(dtype_name, vector_lanes)
    for label, value, top in (
        ("kernel_width", kernel_width, 32), ("stride_w", stride_w, 16),
        ("dilation_w", dilation_w, 16), ("outputs", outputs, 64),
    ):  # fmt: skip
        if not 1 <= value <= top:
            raise ValueError(f"{label} must be in [1, {top}], got {value}")
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
            e = _Emitter(context, builder, signature, dtype_name, lanes)
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
                b.load(e.vector_at(filters_base, b.add(tap_row, e.constant(s * lanes))),
                       align=e.align)
                for s in range(kernel_width)
            ]  # fmt: skip
            row = b.mul(r, step_v)
            updated = list(accumulators)
            for c, feeds in enumerate(uses):
                if not feeds:
                    continue
                value = b.load(
                    e.vector_at(inputs_base, b.add(row, e.constant(c * lanes))), align=e.align
                )
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
                b.store(value, e.vector_at(out_base, e.constant(q * lanes)), align=e.align)
            return context.get_dummy_value()

        return sig, codegen

    return lane_tap_kernel
