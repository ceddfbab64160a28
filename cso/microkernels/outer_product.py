"""LLVM vector IR for the outer-product micro-kernel.

Packed-layout contract (what the generated kernel reads and writes)
-------------------------------------------------------------------
All arrays are 1-D and C-contiguous; every operand is addressed as
``array data pointer + element offset``.

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

Nothing here branches on edges: the packing routines guarantee full tiles.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_LLVM_FLOAT = {"float32": ir.FloatType, "float64": ir.DoubleType}
_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}
_LLVM_SUFFIX = {"float32": "f32", "float64": "f64"}


def build_outer_product_kernel(
    filters_per_tile: int, windows_per_tile: int, dtype_name: str, vector_lanes: int
):
    """Return a Numba intrinsic computing one ``Nf x Nwin`` output tile.

    Parameters
    ----------
    filters_per_tile : int
        ``Nf``, the rows of the register block (one broadcast scalar each).
    windows_per_tile : int
        ``Nwin``, the columns; a multiple of ``vector_lanes``.
    dtype_name : {"float32", "float64"}
        Element type of every operand.
    vector_lanes : int
        ``VL``, elements per vector register (16 for float32 with AVX-512).

    Returns
    -------
    intrinsic
        Callable from ``@njit`` code as
        ``kernel(depth, filters, filters_offset, filters_k_stride,
        filters_i_stride, inputs, inputs_offset, inputs_stride, out, out_offset,
        out_stride, bias, bias_offset, overwrite, add_bias)``.
    """
    if dtype_name not in _LLVM_FLOAT:
        raise ValueError(f"dtype_name must be 'float32' or 'float64', got {dtype_name!r}")
    if windows_per_tile % vector_lanes:
        raise ValueError(
            f"windows_per_tile ({windows_per_tile}) must be a multiple of "
            f"vector_lanes ({vector_lanes})"
        )
    rows = filters_per_tile
    vectors_per_row = windows_per_tile // vector_lanes
    element_type = _LLVM_FLOAT[dtype_name]()
    numba_type = _NUMBA_FLOAT[dtype_name]
    element_bytes = 4 if dtype_name == "float32" else 8
    vector_type = ir.VectorType(element_type, vector_lanes)
    fma_name = f"llvm.fma.v{vector_lanes}{_LLVM_SUFFIX[dtype_name]}"

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
    ):
        for name, arg in (("filters", filters), ("inputs", inputs), ("out", out), ("bias", bias)):
            if not (
                isinstance(arg, types.Array)
                and arg.dtype == numba_type
                and arg.ndim == 1
                and arg.layout == "C"
            ):
                raise TypeError(f"{name} must be a 1-D C-contiguous {dtype_name} array, got {arg}")
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
        )

        def codegen(context, builder, signature, args):
            (
                depth_v,
                filters_a,
                filters_off,
                filters_k_stride_v,
                filters_i_stride_v,
                inputs_a,
                inputs_off,
                inputs_stride_v,
                out_a,
                out_off,
                out_stride_v,
                bias_a,
                bias_off,
                overwrite_v,
                add_bias_v,
            ) = args
            arrays = signature.args

            def base(index, value, offset):
                data = context.make_array(arrays[index])(context, builder, value).data
                return builder.gep(data, [offset])

            filters_ptr = base(1, filters_a, filters_off)
            inputs_ptr = base(5, inputs_a, inputs_off)
            out_ptr = base(8, out_a, out_off)
            bias_ptr = base(11, bias_a, bias_off)

            intp = context.get_value_type(types.intp)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector_type, [vector_type] * 3), fma_name
            )
            zero_vector = ir.Constant(vector_type, [0.0] * vector_lanes)
            broadcast_mask = ir.Constant(
                ir.VectorType(ir.IntType(32), vector_lanes), [0] * vector_lanes
            )
            undef_vector = ir.Constant(vector_type, ir.Undefined)
            vector_ptr_type = vector_type.as_pointer()

            def broadcast(scalar):
                one = builder.insert_element(undef_vector, scalar, ir.Constant(ir.IntType(32), 0))
                return builder.shuffle_vector(one, undef_vector, broadcast_mask)

            entry = builder.basic_block
            loop = builder.append_basic_block("outer_product.loop")
            done = builder.append_basic_block("outer_product.done")
            has_work = builder.icmp_signed(">", depth_v, ir.Constant(intp, 0))
            builder.cbranch(has_work, loop, done)

            # The loop: one rank-1 update per reduction index, accumulators as phis
            # so that LLVM keeps them in registers for the whole reduction.
            builder.position_at_end(loop)
            k = builder.phi(intp, name="k")
            k.add_incoming(ir.Constant(intp, 0), entry)
            accumulators = []
            for i in range(rows):
                row = []
                for v in range(vectors_per_row):
                    phi = builder.phi(vector_type, name=f"acc_{i}_{v}")
                    phi.add_incoming(zero_vector, entry)
                    row.append(phi)
                accumulators.append(row)
            input_row = builder.gep(inputs_ptr, [builder.mul(k, inputs_stride_v)])
            input_vectors = []
            for v in range(vectors_per_row):
                pointer = builder.bitcast(
                    builder.gep(input_row, [ir.Constant(intp, v * vector_lanes)]), vector_ptr_type
                )
                input_vectors.append(builder.load(pointer, align=element_bytes))
            filter_row = builder.gep(filters_ptr, [builder.mul(k, filters_k_stride_v)])
            updated = []
            for i in range(rows):
                scalar = builder.load(
                    builder.gep(filter_row, [builder.mul(ir.Constant(intp, i), filters_i_stride_v)])
                )
                splat = broadcast(scalar)
                updated.append(
                    [
                        builder.call(fma, [splat, input_vectors[v], accumulators[i][v]])
                        for v in range(vectors_per_row)
                    ]
                )
            next_k = builder.add(k, ir.Constant(intp, 1))
            loop_end = builder.basic_block
            k.add_incoming(next_k, loop_end)
            for i in range(rows):
                for v in range(vectors_per_row):
                    accumulators[i][v].add_incoming(updated[i][v], loop_end)
            builder.cbranch(builder.icmp_signed("<", next_k, depth_v), loop, done)

            # The write-back: the epilogue (accumulate or overwrite, bias) happens
            # here, while the tile is still in registers.
            builder.position_at_end(done)
            finals = []
            for i in range(rows):
                row = []
                for v in range(vectors_per_row):
                    phi = builder.phi(vector_type, name=f"final_{i}_{v}")
                    phi.add_incoming(zero_vector, entry)
                    phi.add_incoming(updated[i][v], loop_end)
                    row.append(phi)
                finals.append(row)
            bias_terms = []
            for i in range(rows):
                bias_splat = broadcast(builder.load(builder.gep(bias_ptr, [ir.Constant(intp, i)])))
                bias_terms.append(builder.select(add_bias_v, bias_splat, zero_vector))

            def write_back(accumulate):
                for i in range(rows):
                    out_row = builder.gep(
                        out_ptr, [builder.mul(ir.Constant(intp, i), out_stride_v)]
                    )
                    for v in range(vectors_per_row):
                        pointer = builder.bitcast(
                            builder.gep(out_row, [ir.Constant(intp, v * vector_lanes)]),
                            vector_ptr_type,
                        )
                        value = builder.fadd(finals[i][v], bias_terms[i])
                        if accumulate:
                            value = builder.fadd(builder.load(pointer, align=element_bytes), value)
                        builder.store(value, pointer, align=element_bytes)

            # Overwriting never reads the old tile: no load on the first channel
            # tile, and stale memory (even NaN) cannot leak in.
            with builder.if_else(overwrite_v) as (overwrite_block, accumulate_block):
                with overwrite_block:
                    write_back(accumulate=False)
                with accumulate_block:
                    write_back(accumulate=True)
            return context.get_dummy_value()

        return sig, codegen

    return outer_product_kernel
