"""The IR of one outer-product kernel call: its operands' base pointers,
the reduction loop with accumulators held in registers, and the hand-over
to the write-back (:mod:`.tile_stores`).

Layout relied on: the contract at the top of :mod:`.outer_product` (the
operands' strides, the two vector orientations, the write-back formula).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types

from ..analysis.choices import VectorOperand
from ..packing.transpose import prefetch_function
from .tile_stores import write_columns, write_columns_by_element, write_rows
from .vector_ir import (
    fma_function,
    keep_loop_rolled,
    masked_load_function,
    masked_store_function,
    vector_type,
)

_LLVM_FLOAT = {"float32": ir.FloatType, "float64": ir.DoubleType}


def _i32(value):
    return ir.Constant(ir.IntType(32), value)


class OuterProductEmitter:
    """The IR of one kernel call: the operands' base pointers, then
    :meth:`emit` writes the reduction loop and the write-back."""

    def __init__(self, context, builder, signature, args, dtype_name, lanes):
        (
            self.depth,
            filters_a,
            filters_off,
            self.filters_k_stride,
            self.filters_i_stride,
            inputs_a,
            inputs_off,
            self.inputs_stride,
            out_a,
            out_off,
            self.out_stride,
            bias_a,
            bias_off,
            self.overwrite,
            self.add_bias,
            residual_a,
            residual_off,
            self.activation,
            self.has_residual,
        ) = args
        arrays = signature.args

        element_pointer = _LLVM_FLOAT[dtype_name]().as_pointer()

        def base(index, value, offset):
            if isinstance(arrays[index], types.Integer):
                data = builder.inttoptr(value, element_pointer)
            else:
                data = context.make_array(arrays[index])(context, builder, value).data
            return builder.gep(data, [offset])

        self.builder = builder
        self.filters = base(1, filters_a, filters_off)
        self.inputs = base(5, inputs_a, inputs_off)
        self.out = base(8, out_a, out_off)
        self.bias = base(11, bias_a, bias_off)
        self.residual = base(15, residual_a, residual_off)
        self.intp = context.get_value_type(types.intp)
        self.lanes = lanes
        self.element_bytes = 4 if dtype_name == "float32" else 8
        self.vector_type = vector_type(dtype_name, lanes)
        self.fma = fma_function(builder.module, self.vector_type)
        self.prefetch = prefetch_function(builder.module)
        self.zero = ir.Constant(self.vector_type, [0.0] * lanes)
        self.undef = ir.Constant(self.vector_type, ir.Undefined)

    def constant(self, value):
        return ir.Constant(self.intp, value)

    def broadcast(self, scalar):
        builder = self.builder
        one = builder.insert_element(self.undef, scalar, ir.Constant(ir.IntType(32), 0))
        mask = ir.Constant(ir.VectorType(ir.IntType(32), self.lanes), [0] * self.lanes)
        return builder.shuffle_vector(one, self.undef, mask)

    def vector_pointer(self, pointer, element_offset):
        gep = self.builder.gep(pointer, [self.constant(element_offset)])
        return self.builder.bitcast(gep, self.vector_type.as_pointer())

    def load_vector(self, pointer, element_offset):
        return self.builder.load(
            self.vector_pointer(pointer, element_offset), align=self.element_bytes
        )

    def masked_intrinsic(self, operation):
        """``llvm.masked.load`` or ``llvm.masked.store`` for one vector of this
        kernel's type: ``load(pointer, align, mask, passthrough)``,
        ``store(value, pointer, align, mask)``."""
        declare = masked_load_function if operation == "load" else masked_store_function
        return declare(self.builder.module, self.vector_type)

    def bias_vectors(self, vectors):
        """The bias of filters ``v*VL ..`` for ``v < vectors``, or zeros
        without ``add_bias`` (filters orientation: the bias runs along the lanes)."""
        return [
            self.builder.select(
                self.add_bias, self.load_vector(self.bias, v * self.lanes), self.zero
            )
            for v in range(vectors)
        ]

    def vector_phis(self, rows, columns, name, zeros_from, ends=()):
        """``rows x columns`` vector phis named ``{name}_{i}_{j}`` at the
        builder's position: each zeros from block ``zeros_from``, then
        element ``[i][j]`` of each grid of ``ends``, ``(block, grid)`` pairs
        (the loops' last blocks and their updated accumulators)."""
        grid = []
        for i in range(rows):
            row = []
            for j in range(columns):
                phi = self.builder.phi(self.vector_type, name=f"{name}_{i}_{j}")
                phi.add_incoming(self.zero, zeros_from)
                for block, values in ends:
                    phi.add_incoming(values[i][j], block)
                row.append(phi)
            grid.append(row)
        return grid

    def prefetch_ahead(self, row, step, elements):
        """Prefetch into L1 the ``elements`` from ``row + step`` (``step``: elements)."""
        builder = self.builder
        ahead = builder.gep(row, [step])
        for offset in range(0, elements, 64 // self.element_bytes):
            address = builder.bitcast(
                builder.gep(ahead, [self.constant(offset)]), ir.IntType(8).as_pointer()
            )
            # llvm.prefetch(address, read, keep in all levels, data cache)
            builder.call(self.prefetch, [address, _i32(0), _i32(3), _i32(1)])

    def _loop(self, loop, before, scalar_stride, vector_operand, broadcasts, vectors,
              prefetch_distance, done):  # fmt: skip
        """The reduction loop in block ``loop`` (entered from ``before``), the
        broadcast row ``a`` at ``a * scalar_stride``; ``(last block, updated
        accumulators)`` for the phis after it, in ``done``."""
        builder = self.builder
        windows = vectors * self.lanes if vector_operand == VectorOperand.WINDOWS else broadcasts
        builder.position_at_end(loop)
        k = builder.phi(self.intp, name="k")
        k.add_incoming(self.constant(0), before)
        accumulators = self.vector_phis(broadcasts, vectors, "acc", before)
        filter_row = builder.gep(self.filters, [builder.mul(k, self.filters_k_stride)])
        input_row = builder.gep(self.inputs, [builder.mul(k, self.inputs_stride)])
        if vector_operand == VectorOperand.WINDOWS:
            vector_row, scalar_row = input_row, filter_row
        else:
            vector_row, scalar_row = filter_row, input_row
        if prefetch_distance:
            # Software prefetch of the row prefetch_distance steps ahead, one
            # per cache line: the panels stream from L2, and the hardware
            # prefetchers alone left ResNet-50's layers 2-9% slower
            # (experiments/variants.py).  The broadcast operand is fetched too
            # where its row is contiguous (the input of a filter-vectorised
            # kernel); in-place KCRS filters are Nf strided streams, and
            # prefetching them too (one row per step, in turn) made ResNet-50
            # 3.5% slower.  Past the tile's depth a packed panel runs on into
            # the next call's panel, worth fetching.  Limiting the input read
            # in place to the depth (1x1 layers) cost more in the loop than it saved.
            input_ahead = builder.mul(self.constant(prefetch_distance), self.inputs_stride)
            if vector_operand == VectorOperand.WINDOWS:
                self.prefetch_ahead(input_row, input_ahead, windows)
            else:
                filter_ahead = builder.mul(self.constant(prefetch_distance), self.filters_k_stride)
                self.prefetch_ahead(filter_row, filter_ahead, vectors * self.lanes)
                self.prefetch_ahead(input_row, input_ahead, windows)
        loaded = [self.load_vector(vector_row, v * self.lanes) for v in range(vectors)]
        updated = []
        for a in range(broadcasts):
            offset = builder.mul(self.constant(a), scalar_stride)
            splat = self.broadcast(builder.load(builder.gep(scalar_row, [offset])))
            updated.append(
                [
                    builder.call(self.fma, [splat, loaded[v], accumulators[a][v]])
                    for v in range(vectors)
                ]
            )
        next_k = builder.add(k, self.constant(1))
        loop_end = builder.basic_block
        k.add_incoming(next_k, loop_end)
        for a in range(broadcasts):
            for v in range(vectors):
                accumulators[a][v].add_incoming(updated[a][v], loop_end)
        back_edge = builder.cbranch(builder.icmp_signed("<", next_k, self.depth), loop, done)
        keep_loop_rolled(back_edge)
        return loop_end, updated

    def emit(self, vector_operand, broadcasts, vectors, prefetch_distance, transposed_store=True):
        """The loop over the reduction, accumulators as phis so that LLVM keeps
        them in registers throughout, then the write-back of the tile."""
        builder = self.builder
        windows = vectors * self.lanes if vector_operand == VectorOperand.WINDOWS else broadcasts
        rows = broadcasts if vector_operand == VectorOperand.WINDOWS else vectors * self.lanes
        with builder.if_then(self.has_residual):
            # The residual tile is read once, after the reduction: fetched now,
            # its misses overlap the reduction instead of stalling the
            # write-back (a 1x1 layer of 16 channels took twice as long with a
            # residual from memory, and 1.1x with this).
            for i in range(rows):
                row = builder.gep(self.residual, [builder.mul(self.constant(i), self.out_stride)])
                self.prefetch_ahead(row, self.constant(0), windows)
        entry = builder.basic_block
        done = builder.append_basic_block("outer_product.done")
        loop_args = (vector_operand, broadcasts, vectors, prefetch_distance, done)
        if vector_operand == VectorOperand.WINDOWS:
            # Two copies of the loop: filters packed (row i at i, a constant
            # offset in the load) and read in place (row i at i * stride).
            # Given only the runtime stride, LLVM walked the rows by adding it
            # to one pointer, Nf dependent adds a step, which bounded the AVX2
            # kernels (8 x 8: 40 GFLOP/s, 16 broadcasts and 16 adds per 16 FMAs).
            check = builder.append_basic_block("outer_product.stride")
            builder.cbranch(builder.icmp_signed(">", self.depth, self.constant(0)), check, done)
            builder.position_at_end(check)
            packed = builder.append_basic_block("outer_product.packed")
            strided = builder.append_basic_block("outer_product.strided")
            unit = builder.icmp_signed("==", self.filters_i_stride, self.constant(1))
            builder.cbranch(unit, packed, strided)
            ends = [
                self._loop(packed, check, self.constant(1), *loop_args),
                self._loop(strided, check, self.filters_i_stride, *loop_args),
            ]
        else:
            loop = builder.append_basic_block("outer_product.loop")
            builder.cbranch(builder.icmp_signed(">", self.depth, self.constant(0)), loop, done)
            # Filter i of the row is at i * filters_i_stride, and the contract
            # makes that stride 1 here: the row is Nf contiguous elements.
            ends = [self._loop(loop, entry, self.constant(1), *loop_args)]

        builder.position_at_end(done)
        finals = self.vector_phis(broadcasts, vectors, "final", entry, ends)
        if vector_operand == VectorOperand.WINDOWS:
            write_back = write_rows
        elif transposed_store and not self.lanes & (self.lanes - 1):
            write_back = write_columns
        else:
            write_back = write_columns_by_element
        # Overwriting never reads the old tile: no load on the first channel
        # tile, and stale memory (even NaN) cannot leak in.
        with builder.if_else(self.overwrite) as (overwrite_block, accumulate_block):
            with overwrite_block:
                write_back(self, finals, accumulate=False)
            with accumulate_block:
                write_back(self, finals, accumulate=True)
