"""The write-back of an outer-product tile: its accumulators to the output,
with the bias, the old values when accumulating, and the fused epilogue.

Layout relied on (the contract in :mod:`.outer_product`):
``out[out_offset + i * out_stride + j]`` receives filter ``i``, window
``j``; the residual has the output's layout.  A store never writes past
the tile's last window: the next tile's outputs may live there, so a
partial vector is stored in plain pieces
(:func:`~.vector_ir.store_leading_lanes`).  Each function takes the
:class:`~.outer_product_emitter.OuterProductEmitter` of the call.
"""

from __future__ import annotations

from llvmlite import ir

from .epilogue import emit_epilogue
from .vector_ir import store_leading_lanes, transpose


def store_tile(emitter, stores, accumulate):
    """Store ``stores``, a list of ``(element_offset, value, count)``: each
    ``value`` (a vector, or a scalar for ``count`` None) goes to
    ``out[element_offset ..]``, only its first ``count`` lanes when
    ``count`` is below the lanes.  Accumulating adds the old values, all
    read before any is written (rows fewer than ``VL`` windows apart
    overlap within a vector, and a load that partly overlaps a store still
    in flight stalls); then the epilogue, in registers."""
    builder = emitter.builder
    align = ir.Constant(ir.IntType(32), emitter.element_bytes)
    mask_type = ir.VectorType(ir.IntType(1), emitter.lanes)
    masked_load = emitter.masked_intrinsic("load")

    def pointer(base, offset, value):
        address = builder.gep(base, [offset])
        return (
            address
            if not isinstance(value.type, ir.VectorType)
            else builder.bitcast(address, emitter.vector_type.as_pointer())
        )

    def mask(count):
        return ir.Constant(mask_type, [1 if lane < count else 0 for lane in range(emitter.lanes)])

    def load(base, offset, value, count):
        address = pointer(base, offset, value)
        if count is None:
            return builder.load(address)
        if count == emitter.lanes:
            return builder.load(address, align=emitter.element_bytes)
        return builder.call(masked_load, [address, align, mask(count), emitter.zero])

    values = [value for _, value, _ in stores]
    if accumulate:
        values = [
            builder.fadd(load(emitter.out, offset, value, count), value)
            for offset, value, count in stores
        ]

    def residual_of(index):
        offset, value, count = stores[index]
        return load(emitter.residual, offset, value, count)

    values = emit_epilogue(builder, values, residual_of, emitter.activation, emitter.has_residual)
    for (offset, _, count), value in zip(stores, values):
        address = pointer(emitter.out, offset, value)
        # Nothing past the tile's last window is written: the next tile's
        # outputs may live there.
        if count is None:
            builder.store(value, address)
        elif count == emitter.lanes:
            builder.store(value, address, align=emitter.element_bytes)
        else:
            store_leading_lanes(builder, value, address, count, emitter.element_bytes)


def write_rows(emitter, finals, accumulate):
    """Windows orientation: ``finals[i][v]`` is filter ``i``'s windows
    ``v*VL ..``, stored as vectors along output row ``i``."""
    builder = emitter.builder
    stores = []
    for i, row in enumerate(finals):
        bias_value = builder.load(builder.gep(emitter.bias, [emitter.constant(i)]))
        bias_term = builder.select(emitter.add_bias, emitter.broadcast(bias_value), emitter.zero)
        row_offset = builder.mul(emitter.constant(i), emitter.out_stride)
        for v, final in enumerate(row):
            offset = builder.add(row_offset, emitter.constant(v * emitter.lanes))
            stores.append((offset, builder.fadd(final, bias_term), emitter.lanes))
    store_tile(emitter, stores, accumulate)


def write_columns(emitter, finals, accumulate):
    """Filters orientation: ``finals[j][v]`` is window ``j`` of filters
    ``v*VL ..``; output row ``i`` wants filter ``i`` across the windows.

    Each block of ``VL`` windows is transposed in registers (``log2 VL``
    rounds of two-vector shuffles), then stored as one vector per filter,
    cut to the windows that exist.  Extracting and storing one element
    at a time cost about 400 cycles per 32x14 tile, a tenth of a call of
    depth 256 (``python experiments/kernel_ceiling.py``)."""
    builder = emitter.builder
    lanes = emitter.lanes
    vectors = len(finals[0])
    windows = len(finals)
    bias_terms = emitter.bias_vectors(vectors)
    stores = []
    for first in range(0, windows, lanes):
        count = min(lanes, windows - first)
        for v in range(vectors):
            block = [
                builder.fadd(finals[first + j][v], bias_terms[v]) if j < count else emitter.undef
                for j in range(lanes)
            ]
            for lane, column in enumerate(transpose(builder, block)):
                row = builder.mul(emitter.constant(v * lanes + lane), emitter.out_stride)
                stores.append((builder.add(row, emitter.constant(first)), column, count))
    store_tile(emitter, stores, accumulate)


def write_columns_by_element(emitter, finals, accumulate):
    """Filters orientation, one element at a time: lane ``i`` of
    ``finals[j][v]`` is extracted and stored to row ``v*VL + i``."""
    builder = emitter.builder
    vectors = len(finals[0])
    bias_terms = emitter.bias_vectors(vectors)
    stores = []
    for j, column in enumerate(finals):
        for v, final in enumerate(column):
            value = builder.fadd(final, bias_terms[v])
            for lane in range(emitter.lanes):
                element = builder.extract_element(value, ir.Constant(ir.IntType(32), lane))
                row = builder.mul(emitter.constant(v * emitter.lanes + lane), emitter.out_stride)
                stores.append((builder.add(row, emitter.constant(j)), element, None))
    store_tile(emitter, stores, accumulate)
