"""LLVM vector IR for the lane algorithm's transposes: channel planes to
pixel vectors and back.

The packed-layout contract is :mod:`.lane_taps`'s: for a block of ``VL``
channels ``k0 + l`` of one image, ``valid`` of them real::

    packed[target(i, j) + l] = x[k0 + l][i][j]       (the nest zeroes the padding)
    staged[(p * Q + q) * VL + l] = y[k0 + l][p][q] before the epilogue

where ``target`` is the offset :func:`cso.analysis.lanes.pack_targets`
gives each pixel.  Each kernel moves one ``VL x VL`` block through
registers (:func:`.vector_ir.transpose`: ``log2 VL`` rounds of ``VL``
two-source shuffles).
"""

from __future__ import annotations

import functools

from numba import types
from numba.extending import intrinsic

from .epilogue import emit_epilogue
from .vector_ir import KernelEmitter, check_dtype_and_lanes, check_float_arrays, transpose

# How far ahead of its stores a whole unpack prefetches each channel's output
# for writing: two 64-byte lines.  Its 16 stores a tile go to 16 channel
# planes, each store's line missing L1, and the hardware prefetchers do not
# fetch lines for stores: on a Xeon (Sapphire Rapids) 16 x 16 float32 tiles
# into planes resident in L2 took 102-131 cycles a tile without, 68-74 with
# the prefetch two lines ahead (four lines ahead: 68-108, eight: 82-135).
UNPACK_PREFETCH_BYTES = 128


def _whole_block(e: KernelEmitter, count, valid):
    """The i1 ``count == valid == VL``: a run of ``VL`` pixels of ``VL`` real
    channels, moved with no masks and no branches."""
    lanes = e.constant(e.lanes)
    b = e.builder
    return b.and_(b.icmp_signed("==", count, lanes), b.icmp_signed("==", valid, lanes))


def _real_offset(e: KernelEmitter, real, offset):
    """``offset`` for a real channel, 0 (the block's first) for a missing
    one: its access is masked off entirely, but a masked access whose
    address lies past the array's end took a fault assist on an AMD EPYC
    (Zen 5: filter tiles' missing rows, :mod:`cso.packing.transpose`)."""
    return e.builder.select(real, offset, e.constant(0))


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
    check_dtype_and_lanes(dtype_name, vector_lanes)
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
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            src_base = e.base(0, src_a, src_off)
            dst_base = e.base(5, dst_a, e.constant(0))
            targets_base = e.base(6, targets_a, index_v)
            sources = [b.mul(e.constant(channel), plane_v) for channel in range(lanes)]

            def target(i):
                return b.load(b.gep(targets_base, [e.constant(i)]))

            whole = _whole_block(e, count_v, valid_v)
            with b.if_else(whole, likely=True) as (then, otherwise):
                with then:
                    rows = [
                        e.load(src_base, offset) for offset in sources
                    ]
                    for i, value in enumerate(transpose(b, rows)):
                        e.store(value, dst_base, target(i))
                with otherwise:
                    pixels = e.lanes_below(count_v)
                    rows = []
                    for channel, offset in enumerate(sources):
                        real = b.icmp_signed("<", e.constant(channel), valid_v)
                        at = _real_offset(e, real, offset)
                        rows.append(e.load(src_base, at, e.masked_by(pixels, real)))
                    pixel_vectors = transpose(b, rows)
                    done = b.append_basic_block("pack.done")
                    for i, value in enumerate(pixel_vectors):
                        store = b.append_basic_block(f"pack.store{i}")
                        b.cbranch(b.icmp_signed("<", e.constant(i), count_v), store, done)
                        b.position_at_end(store)
                        e.store(value, dst_base, target(i))
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
    check_dtype_and_lanes(dtype_name, vector_lanes)
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
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            src_base = e.base(0, src_a, src_off)
            dst_base = e.base(4, dst_a, dst_off)
            res_base = e.base(7, res_a, dst_off)
            offsets = [b.mul(e.constant(channel), plane_v) for channel in range(lanes)]
            ahead = e.constant(UNPACK_PREFETCH_BYTES // e.element_bytes)

            def channels():
                pixels = [
                    e.load(src_base, e.constant(i * lanes))
                    for i in range(lanes)
                ]
                return transpose(b, pixels)

            whole = _whole_block(e, count_v, valid_v)
            with b.if_else(whole, likely=True) as (then, otherwise):
                with then:
                    results = emit_epilogue(
                        b,
                        channels(),
                        lambda index: e.load(res_base, offsets[index]),
                        activation_v,
                        has_residual_v,
                    )
                    for offset in offsets:
                        e.prefetch_for_store(dst_base, b.add(offset, ahead))
                    for value, offset in zip(results, offsets):
                        e.store(value, dst_base, offset)
                with otherwise:
                    in_run = e.lanes_below(count_v)
                    real = [
                        b.icmp_signed("<", e.constant(channel), valid_v) for channel in range(lanes)
                    ]
                    masks = [e.masked_by(in_run, is_real) for is_real in real]
                    edge_offsets = [
                        _real_offset(e, is_real, offset) for is_real, offset in zip(real, offsets)
                    ]
                    results = emit_epilogue(
                        b,
                        channels(),
                        lambda index: e.load(res_base, edge_offsets[index], masks[index]),
                        activation_v,
                        has_residual_v,
                    )
                    for value, offset, mask in zip(results, edge_offsets, masks):
                        e.store(value, dst_base, offset, mask)
            return context.get_dummy_value()

        return sig, codegen

    return lane_unpack
