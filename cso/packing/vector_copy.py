"""Masked vector copy: the primitive every packing routine is built on.

``copy_run(dst, dst_offset, src, src_offset, count)`` copies ``count``
contiguous elements with 64-byte vector loads and stores, the last one
masked, so a run of any length costs ``ceil(count / lanes)`` vector
operations and no scalar tail.  Loading a vector at ``src_offset + s`` is
how packing shifts an input row by ``s`` elements: the row is in L1 after
the first load, and every shifted copy is served from there.

LLVM lowers the 64-byte vectors to AVX-512, two AVX2 registers or four NEON
ones, so the routine is portable; only its speed depends on the target.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_VECTOR_BYTES = 64


@intrinsic
def copy_run(typingctx, dst, dst_offset, src, src_offset, count):
    """Copy ``src[src_offset : src_offset + count]`` to ``dst[dst_offset : ...]``."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.dtype == src.dtype and dst.dtype in (types.float32, types.float64)):
        raise TypeError(f"copy_run needs two float arrays of one dtype, got {dst} and {src}")
    float_type = dst.dtype
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        dst_a, dst_off, src_a, src_off, count_v = args
        element = context.get_value_type(float_type)
        element_bytes = 4 if float_type == types.float32 else 8
        lanes = _VECTOR_BYTES // element_bytes
        suffix = "f32" if float_type == types.float32 else "f64"
        vector = ir.VectorType(element, lanes)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        pointer = vector.as_pointer()
        load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [pointer, ir.IntType(32), mask_type, vector]),
            f"llvm.masked.load.v{lanes}{suffix}.p0")
        store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [vector, pointer, ir.IntType(32), mask_type]),
            f"llvm.masked.store.v{lanes}{suffix}.p0")
        dst_ptr = builder.gep(context.make_array(signature.args[0])(context, builder, dst_a).data,
                              [dst_off])
        src_ptr = builder.gep(context.make_array(signature.args[2])(context, builder, src_a).data,
                              [src_off])
        intp = count_v.type
        lane_index = ir.Constant(ir.VectorType(intp, lanes), list(range(lanes)))
        undef = ir.Constant(ir.VectorType(intp, lanes), ir.Undefined)
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
        align = ir.Constant(ir.IntType(32), element_bytes)
        passthrough = ir.Constant(vector, ir.Undefined)
        entry = builder.basic_block
        loop = builder.append_basic_block("copy.loop")
        done = builder.append_basic_block("copy.done")
        builder.cbranch(builder.icmp_signed(">", count_v, ir.Constant(intp, 0)), loop, done)
        builder.position_at_end(loop)
        start = builder.phi(intp)
        start.add_incoming(ir.Constant(intp, 0), entry)
        remaining = builder.sub(count_v, start)
        splat = builder.shuffle_vector(
            builder.insert_element(undef, remaining, ir.Constant(ir.IntType(32), 0)), undef, zeros)
        mask = builder.icmp_signed("<", lane_index, splat)
        source = builder.bitcast(builder.gep(src_ptr, [start]), pointer)
        target = builder.bitcast(builder.gep(dst_ptr, [start]), pointer)
        values = builder.call(load, [source, align, mask, passthrough])
        builder.call(store, [values, target, align, mask])
        following = builder.add(start, ir.Constant(intp, lanes))
        start.add_incoming(following, loop)
        builder.cbranch(builder.icmp_signed("<", following, count_v), loop, done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def gather_run(typingctx, dst, dst_offset, src, src_offset, count, stride):
    """Copy ``src[src_offset + t * stride]`` for ``t < count`` to ``dst[dst_offset + t]``.

    A masked vector gather per ``lanes`` elements: the strided counterpart of
    :func:`copy_run`, used to pack inputs of convolutions with stride > 1.
    """
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.dtype == src.dtype and dst.dtype in (types.float32, types.float64)):
        raise TypeError(f"gather_run needs two float arrays of one dtype, got {dst} and {src}")
    float_type = dst.dtype
    sig = types.void(dst, types.intp, src, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        dst_a, dst_off, src_a, src_off, count_v, stride_v = args
        element = context.get_value_type(float_type)
        element_bytes = 4 if float_type == types.float32 else 8
        lanes = _VECTOR_BYTES // element_bytes
        suffix = "f32" if float_type == types.float32 else "f64"
        vector = ir.VectorType(element, lanes)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        intp = count_v.type
        index_vector_type = ir.VectorType(intp, lanes)
        pointer_vector_type = ir.VectorType(element.as_pointer(), lanes)
        gather = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vector, [pointer_vector_type, ir.IntType(32), mask_type, vector]),
            f"llvm.masked.gather.v{lanes}{suffix}.v{lanes}p0")
        store = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), ir.IntType(32), mask_type]),
            f"llvm.masked.store.v{lanes}{suffix}.p0")
        dst_ptr = builder.gep(context.make_array(signature.args[0])(context, builder, dst_a).data,
                              [dst_off])
        src_ptr = builder.gep(context.make_array(signature.args[2])(context, builder, src_a).data,
                              [src_off])
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
        undef = ir.Constant(index_vector_type, ir.Undefined)

        def splat(value):
            one = builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(one, undef, zeros)

        lane_index = ir.Constant(index_vector_type, list(range(lanes)))
        # Byte offsets of the lanes: t * stride * element_bytes.
        lane_bytes = builder.mul(lane_index, splat(builder.mul(stride_v, ir.Constant(intp, element_bytes))))
        align = ir.Constant(ir.IntType(32), element_bytes)
        passthrough = ir.Constant(vector, ir.Undefined)
        entry = builder.basic_block
        loop = builder.append_basic_block("gather.loop")
        done = builder.append_basic_block("gather.done")
        builder.cbranch(builder.icmp_signed(">", count_v, ir.Constant(intp, 0)), loop, done)
        builder.position_at_end(loop)
        start = builder.phi(intp)
        start.add_incoming(ir.Constant(intp, 0), entry)
        mask = builder.icmp_signed("<", lane_index, splat(builder.sub(count_v, start)))
        first = builder.ptrtoint(builder.gep(src_ptr, [builder.mul(start, stride_v)]), intp)
        addresses = builder.inttoptr(builder.add(splat(first), lane_bytes), pointer_vector_type)
        values = builder.call(gather, [addresses, align, mask, passthrough])
        target = builder.bitcast(builder.gep(dst_ptr, [start]), vector.as_pointer())
        builder.call(store, [values, target, align, mask])
        following = builder.add(start, ir.Constant(intp, lanes))
        start.add_incoming(following, loop)
        builder.cbranch(builder.icmp_signed("<", following, count_v), loop, done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen
