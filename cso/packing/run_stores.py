"""Storing a vector's leading lanes, and copying runs: the pieces packing
and the loop nests' edge tiles share.

* :func:`store_vector` stores a whole vector, or only its first lanes in
  plain power-of-two pieces (never a masked store, microcoded on AMD).
* :func:`store_run` emits the loop over a run's vectors, each stored by
  :func:`store_vector`; :func:`copy_run` (edge tiles out of scratch) and
  the loop nests' ``epilogue_run`` are built on it, in vectors and no
  scalar tail.

:func:`copy_run` takes a last argument ``vector``, the vector token of the
plan's width (:func:`~cso.packing.transpose.vector_token`).  Like
:mod:`.vector_copy`, this file is hashed into every generated module's name
(:mod:`cso.macrokernel.specialise`), so a change here never leaves a stale
kernel in the cache.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..microkernels.vector_ir import lanes_below, store_leading_lanes
from .transpose import check_float_pair, masked_load_store, token_lanes


def store_vector(builder, values, address, element_bytes, remaining, whole):
    """Store ``values`` at ``address``: plainly when ``whole`` (an i1: every
    lane is in the run), else its first ``remaining`` lanes (an integer IR
    value, 1 to lanes - 1) in plain power-of-two pieces, one case of a
    switch on ``remaining`` each.

    Masked stores are microcoded on AMD: on an AMD EPYC (Zen 4) a depthwise
    layer whose stores were all masked ran 1.55x longer than with whole
    ones.  On a Zen 3 the input panels of 28x28, 14x14 and 7x7 layers (and
    strided ones), whose runs end inside their panel row in every tile,
    packed 1.15-1.33x faster with the pieces than with masked stores, 56x56
    ones (runs of whole vectors) the same (the builds side by side in one
    process, interleaved; a read-modify-write blend ran like the pieces).
    """
    with builder.if_else(whole, likely=True) as (plain, partial):
        with plain:
            builder.store(values, address, align=element_bytes)
        with partial:
            lanes = values.type.count
            merge = builder.append_basic_block("pieces.done")
            switch = builder.switch(builder.trunc(remaining, ir.IntType(32)), merge)
            for count in range(1, lanes):
                case = builder.append_basic_block(f"pieces.{count}")
                switch.add_case(ir.Constant(ir.IntType(32), count), case)
                builder.position_at_end(case)
                store_leading_lanes(builder, values, address, count, element_bytes)
                builder.branch(merge)
            builder.position_at_end(merge)


def store_run(builder, count, lanes, element_bytes, name, vector_at):
    """Emit the loop over a run of ``count`` elements (an integer IR value)
    in vectors of ``lanes``: for each vector's first element ``start``,
    ``vector_at(start, mask)`` (``mask``: its lanes inside the run) emits
    ``(values, address)``, stored by :func:`store_vector`, the run's last,
    partial vector in pieces.  A run of none emits no iteration; the
    builder is left after the loop."""
    intp = count.type
    entry = builder.basic_block
    loop = builder.append_basic_block(f"{name}.loop")
    done = builder.append_basic_block(f"{name}.done")
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(intp, 0)), loop, done)
    builder.position_at_end(loop)
    start = builder.phi(intp)
    start.add_incoming(ir.Constant(intp, 0), entry)
    remaining = builder.sub(count, start)
    values, address = vector_at(start, lanes_below(builder, remaining, lanes))
    following = builder.add(start, ir.Constant(intp, lanes))
    whole = builder.icmp_signed("<=", following, count)
    store_vector(builder, values, address, element_bytes, remaining, whole)
    start.add_incoming(following, builder.basic_block)
    builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
    builder.position_at_end(done)


@intrinsic
def copy_run(typingctx, dst, dst_offset, src, src_offset, count, vector):
    """Copy ``src[src_offset : src_offset + count]`` to ``dst[dst_offset : ...]``."""
    check_float_pair("copy_run", dst, src)
    float_type = dst.dtype
    lanes = token_lanes(vector)
    sig = types.void(dst, types.intp, src, types.intp, types.intp, vector)

    def codegen(context, builder, signature, args):
        dst_a, dst_off, src_a, src_off, count_v, _ = args
        element = context.get_value_type(float_type)
        element_bytes = 4 if float_type == types.float32 else 8
        vector = ir.VectorType(element, lanes)
        pointer = vector.as_pointer()
        load, _ = masked_load_store(builder.module, vector)
        dst_ptr = builder.gep(
            context.make_array(signature.args[0])(context, builder, dst_a).data, [dst_off]
        )
        src_ptr = builder.gep(
            context.make_array(signature.args[2])(context, builder, src_a).data, [src_off]
        )
        align = ir.Constant(ir.IntType(32), element_bytes)
        passthrough = ir.Constant(vector, ir.Undefined)

        def vector_at(start, mask):
            source = builder.bitcast(builder.gep(src_ptr, [start]), pointer)
            target = builder.bitcast(builder.gep(dst_ptr, [start]), pointer)
            return builder.call(load, [source, align, mask, passthrough]), target

        store_run(builder, count_v, lanes, element_bytes, "copy", vector_at)
        return context.get_dummy_value()

    return sig, codegen
