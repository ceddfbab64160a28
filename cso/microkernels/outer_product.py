"""LLVM vector IR for the outer-product micro-kernel.

Packed-layout contract (what the generated kernel reads and writes)
-------------------------------------------------------------------
All arrays are 1-D and C-contiguous; every operand is addressed as
``array data pointer + element offset``.  ``filters``, ``inputs`` and
``out`` may also be given as the integer address of such an array's data
(``arr.ctypes.data``): a loop nest that picks one of two arrays per tile
then picks an integer, where a choice between arrays would cost every tile
a reference-count update on each (atomic, ~30 ns a tile on an AMD EPYC
Zen 3: a 1x1 layer of 24 channels spent 0.17 of its 0.44 ms on them).
The caller keeps the arrays alive through the call.

* ``filters[filters_offset + k * filters_k_stride + i * filters_i_stride]``
  is element ``k`` of the reduction (``k = (c * R + r) * S + s``) for filter
  ``i`` of the tile.  A packed panel has strides ``(Nf, 1)`` (``Nf`` filters
  side by side, see :mod:`cso.packing.filters`); the KCRS filters read in
  place have ``(1, C*R*S)``.  Either way it is one broadcast load per
  ``(k, i)``, which is why both run at the same speed.
* ``inputs[inputs_offset + k * inputs_stride + j]`` is the same reduction
  element for window ``j`` of the tile (windows beyond the output, and taps
  that read padding, are zero).  ``inputs_stride`` is ``Nwin`` for a packed
  panel, or the channel plane ``H*W`` when a 1x1 stride-1 convolution reads
  the input in place.
* ``out[out_offset + i * out_stride + j]`` receives filter ``i``, window ``j``.

The kernel computes, for ``k`` in ``0 .. depth-1``, the rank-1 update
``acc[i, j] += filters[k, i] * inputs[k, j]`` with ``acc`` held in
``Nf * Nwin / VL`` vector registers (``VL`` lanes each), then writes::

    out[i, j] = (0 if overwrite else out[i, j]) + (acc[i, j] + (bias[i] if add_bias else 0))

followed, in registers, by the fused epilogue (:mod:`.epilogue`) when the
caller asks for it (``activation`` not 0, or ``has_residual``: the last
channel tile of a full output tile)::

    out[i, j] = act(out[i, j] + residual[residual_offset + i * out_stride + j])

The residual has the output's layout and row stride.  Nothing here
branches on edges: the packing routines guarantee full tiles.

Two orientations, one contract
------------------------------
* ``vector_operand="windows"`` (the SConv kernel): ``acc[i]`` is
  ``Nwin / VL`` vectors of windows; each step loads the input row as
  vectors and broadcasts one filter value per row ``i``.  ``Nwin`` must be
  a multiple of ``VL``; the filters may have any strides.
* ``vector_operand="filters"``: ``acc[j]`` is ``Nf / VL`` vectors of
  filters; each step loads the filter row as vectors (so
  ``filters_i_stride`` must be 1: packed panels only) and broadcasts one
  input value per window ``j``.  ``Nf`` must be a multiple of ``VL`` and
  ``Nwin`` may be anything, which is the point: a layer with 49 or 196
  windows wastes lanes when windows are the vector dimension (49 in 64
  lanes), none when 32 filters are.  The tile is transposed in registers
  and stored one vector per filter, masked to the ``Nwin`` windows: that
  costs ``O(Nf*Nwin*log VL / VL)`` against the reduction's
  ``O(Nf*Nwin*depth)``.
* ``vector_operand="reduction"`` (dot products): ``acc[i][j]`` is one
  vector of partial sums over ``VL`` consecutive reduction indices; each
  step loads ``VL`` elements of filter ``i`` (``filters_k_stride`` must be
  1: KCRS rows read in place) and of window ``j`` (the window's elements
  contiguous: ``inputs[inputs_offset + j * inputs_stride + k]``), masked
  past ``depth``, and the lanes are summed at the end.  Any ``Nf`` and
  ``Nwin``; meant for a fully connected layer written as a convolution,
  one window whose elements are the input itself, where vectors along the
  windows would hold one useful lane in ``VL``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..analysis.choices import VectorOperand, parse_choice
from .epilogue import emit_epilogue
from .vector_ir import (
    fma_function,
    masked_load_function,
    masked_store_function,
    transpose,
    vector_type,
)

_LLVM_FLOAT = {"float32": ir.FloatType, "float64": ir.DoubleType}
_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}
# The operands a caller may pass as the address of an array's data.
_ADDRESSABLE = ("filters", "inputs", "out")


def _i32(value):
    return ir.Constant(ir.IntType(32), value)


def prefetches_rows(row_elements: int, element_bytes: int, line_bytes: int = 64) -> bool:
    """Whether a kernel prefetches its vector operand's rows: only when a row
    (``row_elements`` of ``element_bytes``) fills at least a cache line.

    A shorter row would prefetch every line twice, one software prefetch
    per step among few loads.  Measured on an AMD EPYC (Zen 3, AVX2): the
    8 x 8 window-vectorised kernel (32-byte rows, nine loads per eight
    FMAs) ran ResNet-50 layers at 41-48 GFLOP/s with the prefetch and
    53-68 without (``experiments/variants.py --variant no-prefetch``).
    """
    return row_elements * element_bytes >= line_bytes


def build_outer_product_kernel(
    filters_per_tile: int,
    windows_per_tile: int,
    dtype_name: str,
    vector_lanes: int,
    vector_operand: str = "windows",
    prefetch_distance: int = 16,
    transposed_store: bool = True,
):
    """Return a Numba intrinsic computing one ``Nf x Nwin`` output tile.

    Parameters
    ----------
    filters_per_tile : int
        ``Nf``, the rows of the output tile.
    windows_per_tile : int
        ``Nwin``, its columns.
    dtype_name : {"float32", "float64"}
        Element type of every operand.
    vector_lanes : int
        ``VL``, elements per vector register (16 for float32 with AVX-512).
    vector_operand : {"windows", "filters", "reduction"}
        Which operand fills the vectors (see the module docstring); its
        tile size must be a multiple of ``vector_lanes``.
    prefetch_distance : int
        Reduction steps ahead at which the windows and filters orientations
        prefetch their contiguous operand rows into L1; 0 for none.  16
        steps (1-2 KiB of a packed panel) measured best of 8, 16 and 32.
        A row shorter than a cache line is not prefetched
        (:func:`prefetches_rows`).
    transposed_store : bool
        Filters orientation only: write the tile back by transposing it in
        registers (True), or one element at a time (False, kept to measure
        the difference: ``python experiments/variants.py --variant
        element-stores``).  Vectors whose lanes are not a power of two
        always take the element path.

    Returns
    -------
    intrinsic
        Callable from ``@njit`` code as
        ``kernel(depth, filters, filters_offset, filters_k_stride,
        filters_i_stride, inputs, inputs_offset, inputs_stride, out, out_offset,
        out_stride, bias, bias_offset, overwrite, add_bias, residual,
        residual_offset, activation, has_residual)``; ``activation`` is
        :func:`~cso.analysis.choices.activation_code`'s number (0: none).
    """
    if dtype_name not in _LLVM_FLOAT:
        raise ValueError(f"dtype_name must be 'float32' or 'float64', got {dtype_name!r}")
    vector_operand = parse_choice(VectorOperand, vector_operand, "vector_operand")
    vectorised = windows_per_tile if vector_operand == VectorOperand.WINDOWS else filters_per_tile
    name = "windows_per_tile" if vector_operand == VectorOperand.WINDOWS else "filters_per_tile"
    if vector_operand != VectorOperand.REDUCTION and vectorised % vector_lanes:
        raise ValueError(
            f"{name} ({vectorised}) must be a multiple of vector_lanes ({vector_lanes}) "
            f"when vector_operand={vector_operand!r}"
        )
    # acc[a][v]: a runs over the broadcast operand, v over the vectors of the other.
    if vector_operand == VectorOperand.WINDOWS:
        broadcasts, vectors = filters_per_tile, windows_per_tile // vector_lanes
    elif vector_operand == VectorOperand.FILTERS:
        broadcasts, vectors = windows_per_tile, filters_per_tile // vector_lanes
    else:
        broadcasts, vectors = filters_per_tile, windows_per_tile
    numba_type = _NUMBA_FLOAT[dtype_name]

    @intrinsic
    def outer_product_kernel(
        typingctx,
        depth,
        filters,
        filters_offset,
        filters_k_stride,
        filters_i_stride,
        inputs,
        inputs_offset,
        inputs_stride,
        out,
        out_offset,
        out_stride,
        bias,
        bias_offset,
        overwrite,
        add_bias,
        residual,
        residual_offset,
        activation,
        has_residual,
    ):
        for label, arg in (
            ("filters", filters),
            ("inputs", inputs),
            ("out", out),
            ("bias", bias),
            ("residual", residual),
        ):
            if label in _ADDRESSABLE and isinstance(arg, types.Integer):
                continue
            if not (
                isinstance(arg, types.Array)
                and arg.dtype == numba_type
                and arg.ndim == 1
                and arg.layout == "C"
            ):
                raise TypeError(
                    f"{label} must be a 1-D C-contiguous {dtype_name} array"
                    + (" or its data's address" if label in _ADDRESSABLE else "")
                    + f", got {arg}"
                )
        sig = types.void(
            types.intp,
            filters,
            types.intp,
            types.intp,
            types.intp,
            inputs,
            types.intp,
            types.intp,
            out,
            types.intp,
            types.intp,
            bias,
            types.intp,
            types.boolean,
            types.boolean,
            residual,
            types.intp,
            types.intp,
            types.boolean,
        )

        row_elements = vectors * vector_lanes
        distance = (
            prefetch_distance if prefetches_rows(row_elements, np.dtype(dtype_name).itemsize) else 0
        )

        def codegen(context, builder, signature, args):
            emitter = _Emitter(context, builder, signature, args, dtype_name, vector_lanes)
            if vector_operand == VectorOperand.REDUCTION:
                emitter.emit_dot_products(broadcasts, vectors)
            else:
                emitter.emit(vector_operand, broadcasts, vectors, distance, transposed_store)
            return context.get_dummy_value()

        return sig, codegen

    return outer_product_kernel


class _Emitter:
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
        self.prefetch = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] + [ir.IntType(32)] * 3),
            "llvm.prefetch.p0",
        )
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

    def _prefetch_ahead(self, row, step, elements):
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
        accumulators = []
        for a in range(broadcasts):
            row = []
            for v in range(vectors):
                phi = builder.phi(self.vector_type, name=f"acc_{a}_{v}")
                phi.add_incoming(self.zero, before)
                row.append(phi)
            accumulators.append(row)
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
                self._prefetch_ahead(input_row, input_ahead, windows)
            else:
                filter_ahead = builder.mul(self.constant(prefetch_distance), self.filters_k_stride)
                self._prefetch_ahead(filter_row, filter_ahead, vectors * self.lanes)
                self._prefetch_ahead(input_row, input_ahead, windows)
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
        builder.cbranch(builder.icmp_signed("<", next_k, self.depth), loop, done)
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
                self._prefetch_ahead(row, self.constant(0), windows)
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
        finals = []
        for a in range(broadcasts):
            row = []
            for v in range(vectors):
                phi = builder.phi(self.vector_type, name=f"final_{a}_{v}")
                phi.add_incoming(self.zero, entry)
                for loop_end, updated in ends:
                    phi.add_incoming(updated[a][v], loop_end)
                row.append(phi)
            finals.append(row)
        if vector_operand == VectorOperand.WINDOWS:
            write_back = self._write_rows
        elif transposed_store and not self.lanes & (self.lanes - 1):
            write_back = self._write_columns
        else:
            write_back = self._write_columns_by_element
        # Overwriting never reads the old tile: no load on the first channel
        # tile, and stale memory (even NaN) cannot leak in.
        with builder.if_else(self.overwrite) as (overwrite_block, accumulate_block):
            with overwrite_block:
                write_back(finals, accumulate=False)
            with accumulate_block:
                write_back(finals, accumulate=True)

    def emit_dot_products(self, rows, columns):
        """Reduction orientation: ``rows x columns`` dot products, ``VL``
        reduction indices per step, masked loads past ``depth`` (so any depth
        is exact and nothing past an operand is read), lanes summed at the end."""
        builder = self.builder
        lanes = self.lanes
        pointer_type = self.vector_type.as_pointer()
        masked_load = self.masked_intrinsic("load")
        align = ir.Constant(ir.IntType(32), self.element_bytes)
        lane_index = ir.Constant(ir.VectorType(self.intp, lanes), list(range(lanes)))
        index_undef = ir.Constant(ir.VectorType(self.intp, lanes), ir.Undefined)
        splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)

        entry = builder.basic_block
        loop = builder.append_basic_block("dot.loop")
        done = builder.append_basic_block("dot.done")
        builder.cbranch(builder.icmp_signed(">", self.depth, self.constant(0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(self.intp, name="k")
        k.add_incoming(self.constant(0), entry)
        accumulators = []
        for i in range(rows):
            row = []
            for j in range(columns):
                phi = builder.phi(self.vector_type, name=f"dot_{i}_{j}")
                phi.add_incoming(self.zero, entry)
                row.append(phi)
            accumulators.append(row)
        remaining = builder.sub(self.depth, k)
        remaining_splat = builder.shuffle_vector(
            builder.insert_element(index_undef, remaining, ir.Constant(ir.IntType(32), 0)),
            index_undef,
            splat_mask,
        )
        mask = builder.icmp_signed("<", lane_index, remaining_splat)

        def load(base, row_offset):
            pointer = builder.gep(base, [builder.add(row_offset, k)])
            return builder.call(
                masked_load, [builder.bitcast(pointer, pointer_type), align, mask, self.zero]
            )

        windows = [
            load(self.inputs, builder.mul(self.constant(j), self.inputs_stride))
            for j in range(columns)
        ]
        updated = []
        for i in range(rows):
            weights = load(self.filters, builder.mul(self.constant(i), self.filters_i_stride))
            updated.append(
                [
                    builder.call(self.fma, [weights, windows[j], accumulators[i][j]])
                    for j in range(columns)
                ]
            )
        next_k = builder.add(k, self.constant(lanes))
        loop_end = builder.basic_block
        k.add_incoming(next_k, loop_end)
        for i in range(rows):
            for j in range(columns):
                accumulators[i][j].add_incoming(updated[i][j], loop_end)
        builder.cbranch(builder.icmp_signed("<", next_k, self.depth), loop, done)

        builder.position_at_end(done)
        finals = []
        for i in range(rows):
            row = []
            for j in range(columns):
                final = builder.phi(self.vector_type, name=f"dot_final_{i}_{j}")
                final.add_incoming(self.zero, entry)
                final.add_incoming(updated[i][j], loop_end)
                row.append(final)
            finals.append(row)
        sums = []
        for i in range(rows):
            bias_value = builder.load(builder.gep(self.bias, [self.constant(i)]))
            total_row = []
            for j in range(columns):
                total = builder.select(self.add_bias, bias_value, ir.Constant(bias_value.type, 0.0))
                for lane in range(lanes):
                    element = builder.extract_element(
                        finals[i][j], ir.Constant(ir.IntType(32), lane)
                    )
                    total = builder.fadd(total, element)
                total_row.append(total)
            sums.append(total_row)
        stores = [
            (builder.add(builder.mul(self.constant(i), self.out_stride), self.constant(j)),
             sums[i][j], None)
            for i in range(rows)
            for j in range(columns)
        ]  # fmt: skip
        with builder.if_else(self.overwrite) as (overwrite_block, accumulate_block):
            with overwrite_block:
                self._store_tile(stores, accumulate=False)
            with accumulate_block:
                self._store_tile(stores, accumulate=True)

    def _store_tile(self, stores, accumulate):
        """Store ``stores``, a list of ``(element_offset, value, count)``: each
        ``value`` (a vector, or a scalar for ``count`` None) goes to
        ``out[element_offset ..]``, masked to its first ``count`` lanes when
        ``count`` is below the lanes.  Accumulating adds the old values, all
        read before any is written (rows fewer than ``VL`` windows apart
        overlap within a vector, and a load that partly overlaps a masked
        store still in flight stalls); then the epilogue, in registers."""
        builder = self.builder
        align = ir.Constant(ir.IntType(32), self.element_bytes)
        mask_type = ir.VectorType(ir.IntType(1), self.lanes)
        masked_load = self.masked_intrinsic("load")
        masked_store = self.masked_intrinsic("store")

        def pointer(base, offset, value):
            address = builder.gep(base, [offset])
            return address if not isinstance(value.type, ir.VectorType) else builder.bitcast(
                address, self.vector_type.as_pointer()
            )

        def mask(count):
            return ir.Constant(mask_type, [1 if lane < count else 0 for lane in range(self.lanes)])

        def load(base, offset, value, count):
            address = pointer(base, offset, value)
            if count is None:
                return builder.load(address)
            if count == self.lanes:
                return builder.load(address, align=self.element_bytes)
            return builder.call(masked_load, [address, align, mask(count), self.zero])

        values = [value for _, value, _ in stores]
        if accumulate:
            values = [
                builder.fadd(load(self.out, offset, value, count), value)
                for offset, value, count in stores
            ]

        def residual_of(index):
            offset, value, count = stores[index]
            return load(self.residual, offset, value, count)

        values = emit_epilogue(builder, values, residual_of, self.activation, self.has_residual)
        for (offset, _, count), value in zip(stores, values):
            address = pointer(self.out, offset, value)
            # Masked, so that nothing past the tile's last window is written:
            # the next tile's outputs may live there.
            if count is None:
                builder.store(value, address)
            elif count == self.lanes:
                builder.store(value, address, align=self.element_bytes)
            else:
                builder.call(masked_store, [value, address, align, mask(count)])

    def _write_rows(self, finals, accumulate):
        """Windows orientation: ``finals[i][v]`` is filter ``i``'s windows
        ``v*VL ..``, stored as vectors along output row ``i``."""
        builder = self.builder
        stores = []
        for i, row in enumerate(finals):
            bias_value = builder.load(builder.gep(self.bias, [self.constant(i)]))
            bias_term = builder.select(self.add_bias, self.broadcast(bias_value), self.zero)
            row_offset = builder.mul(self.constant(i), self.out_stride)
            for v, final in enumerate(row):
                offset = builder.add(row_offset, self.constant(v * self.lanes))
                stores.append((offset, builder.fadd(final, bias_term), self.lanes))
        self._store_tile(stores, accumulate)

    def _write_columns(self, finals, accumulate):
        """Filters orientation: ``finals[j][v]`` is window ``j`` of filters
        ``v*VL ..``; output row ``i`` wants filter ``i`` across the windows.

        Each block of ``VL`` windows is transposed in registers (``log2 VL``
        rounds of two-vector shuffles), then stored as one vector per filter,
        masked to the windows that exist.  Extracting and storing one element
        at a time cost about 400 cycles per 32x14 tile, a tenth of a call of
        depth 256 (``python experiments/kernel_ceiling.py``)."""
        builder = self.builder
        lanes = self.lanes
        vectors = len(finals[0])
        windows = len(finals)
        bias_terms = self.bias_vectors(vectors)
        stores = []
        for first in range(0, windows, lanes):
            count = min(lanes, windows - first)
            for v in range(vectors):
                block = [
                    builder.fadd(finals[first + j][v], bias_terms[v]) if j < count else self.undef
                    for j in range(lanes)
                ]
                for lane, column in enumerate(transpose(builder, block)):
                    row = builder.mul(self.constant(v * lanes + lane), self.out_stride)
                    stores.append((builder.add(row, self.constant(first)), column, count))
        self._store_tile(stores, accumulate)

    def _write_columns_by_element(self, finals, accumulate):
        """Filters orientation, one element at a time: lane ``i`` of
        ``finals[j][v]`` is extracted and stored to row ``v*VL + i``."""
        builder = self.builder
        vectors = len(finals[0])
        bias_terms = self.bias_vectors(vectors)
        stores = []
        for j, column in enumerate(finals):
            for v, final in enumerate(column):
                value = builder.fadd(final, bias_terms[v])
                for lane in range(self.lanes):
                    element = builder.extract_element(value, ir.Constant(ir.IntType(32), lane))
                    row = builder.mul(self.constant(v * self.lanes + lane), self.out_stride)
                    stores.append((builder.add(row, self.constant(j)), element, None))
        self._store_tile(stores, accumulate)
