"""The reduction orientation of the outer-product kernel: dot products.

Layout relied on (the contract in :mod:`.outer_product`): each step loads
``VL`` consecutive reduction elements of filter ``i``
(``filters[filters_offset + i * filters_i_stride + k]``, KCRS rows read in
place) and of window ``j`` (``inputs[inputs_offset + j * inputs_stride +
k]``), masked past ``depth``, so nothing past an operand is read; the
lanes are summed at the end and written through
:func:`.tile_stores.store_tile` one element at a time.
"""

from __future__ import annotations

from llvmlite import ir

from .tile_stores import store_tile


def emit_dot_products(emitter, rows, columns):
    """Reduction orientation: ``rows x columns`` dot products, ``VL``
    reduction indices per step, masked loads past ``depth`` (so any depth
    is exact and nothing past an operand is read), lanes summed at the end."""
    builder = emitter.builder
    lanes = emitter.lanes
    pointer_type = emitter.vector_type.as_pointer()
    masked_load = emitter.masked_intrinsic("load")
    align = ir.Constant(ir.IntType(32), emitter.element_bytes)
    lane_index = ir.Constant(ir.VectorType(emitter.intp, lanes), list(range(lanes)))
    index_undef = ir.Constant(ir.VectorType(emitter.intp, lanes), ir.Undefined)
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)

    entry = builder.basic_block
    loop = builder.append_basic_block("dot.loop")
    done = builder.append_basic_block("dot.done")
    builder.cbranch(builder.icmp_signed(">", emitter.depth, emitter.constant(0)), loop, done)
    builder.position_at_end(loop)
    k = builder.phi(emitter.intp, name="k")
    k.add_incoming(emitter.constant(0), entry)
    accumulators = emitter.vector_phis(rows, columns, "dot", entry)
    remaining = builder.sub(emitter.depth, k)
    remaining_splat = builder.shuffle_vector(
        builder.insert_element(index_undef, remaining, ir.Constant(ir.IntType(32), 0)),
        index_undef,
        splat_mask,
    )
    mask = builder.icmp_signed("<", lane_index, remaining_splat)

    def load(base, row_offset):
        pointer = builder.gep(base, [builder.add(row_offset, k)])
        return builder.call(
            masked_load, [builder.bitcast(pointer, pointer_type), align, mask, emitter.zero]
        )

    windows = [
        load(emitter.inputs, builder.mul(emitter.constant(j), emitter.inputs_stride))
        for j in range(columns)
    ]
    updated = []
    for i in range(rows):
        weights = load(emitter.filters, builder.mul(emitter.constant(i), emitter.filters_i_stride))
        updated.append(
            [
                builder.call(emitter.fma, [weights, windows[j], accumulators[i][j]])
                for j in range(columns)
            ]
        )
    next_k = builder.add(k, emitter.constant(lanes))
    loop_end = builder.basic_block
    k.add_incoming(next_k, loop_end)
    for i in range(rows):
        for j in range(columns):
            accumulators[i][j].add_incoming(updated[i][j], loop_end)
    builder.cbranch(builder.icmp_signed("<", next_k, emitter.depth), loop, done)

    builder.position_at_end(done)
    finals = emitter.vector_phis(rows, columns, "dot_final", entry, [(loop_end, updated)])
    sums = []
    for i in range(rows):
        bias_value = builder.load(builder.gep(emitter.bias, [emitter.constant(i)]))
        total_row = []
        for j in range(columns):
            total = builder.select(emitter.add_bias, bias_value, ir.Constant(bias_value.type, 0.0))
            for lane in range(lanes):
                element = builder.extract_element(finals[i][j], ir.Constant(ir.IntType(32), lane))
                total = builder.fadd(total, element)
            total_row.append(total)
        sums.append(total_row)
    stores = [
        (builder.add(builder.mul(emitter.constant(i), emitter.out_stride), emitter.constant(j)),
         sums[i][j], None)
        for i in range(rows)
        for j in range(columns)
    ]  # fmt: skip
    with builder.if_else(emitter.overwrite) as (overwrite_block, accumulate_block):
        with overwrite_block:
            store_tile(emitter, stores, accumulate=False)
        with accumulate_block:
            store_tile(emitter, stores, accumulate=True)
