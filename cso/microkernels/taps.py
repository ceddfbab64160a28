"""LLVM vector IR for the tap micro-kernel of depthwise convolutions.

Packed-layout contract
----------------------
One call computes ``count <= vectors * VL`` consecutive outputs of one output
row of one channel, held in ``vectors`` registers of ``VL`` lanes::

    out[out_offset + j] = bias + sum_t weights[weights_offset + t]
                                       * inputs[inputs_offset + offsets[t] + j]

for ``j < count`` (``t < taps``), then the fused epilogue in registers
(:mod:`.epilogue`): ``out[out_offset + j] = act(out[out_offset + j] +
residual[residual_offset + j])``, the residual read only when
``has_residual`` and ``act`` numbered by ``activation`` (0: none).
``offsets[t]`` is where tap ``t``'s input row segment starts relative to the output's: the packing
(:mod:`cso.packing.depthwise`) lays each input channel out so that every
tap, whatever the stride and dilation, reads a *contiguous* run, and pads
it with zeros so that the ``vectors * VL`` loads of every call are in
bounds.  Only the write-back is masked to ``count``, so nothing branches on
an edge.  Each tap is one broadcast and ``vectors`` loads and FMAs: the
kernel's ceiling is the loads beside the FMAs, one of each per vector.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .epilogue import emit_epilogue

_LLVM_FLOAT = {"float32": ir.FloatType, "float64": ir.DoubleType}
_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}
_SUFFIX = {"float32": "f32", "float64": "f64"}


@functools.lru_cache(maxsize=None)
def build_tap_kernel(vectors: int, dtype_name: str, vector_lanes: int):
    """Return a Numba intrinsic computing one row segment of ``vectors * VL`` outputs.

    Parameters
    ----------
    vectors : int
        Accumulator vectors (the segment is ``vectors * vector_lanes`` wide).
    dtype_name : {"float32", "float64"}
    vector_lanes : int
        ``VL``, elements per vector.

    Returns
    -------
    intrinsic
        Callable from ``@njit`` code as ``kernel(taps, weights,
        weights_offset, offsets, inputs, inputs_offset, out, out_offset,
        count, bias, residual, residual_offset, activation, has_residual)``
        (see the module docstring).
    """
    if dtype_name not in _NUMBA_FLOAT:
        raise ValueError(f"dtype_name must be float32 or float64, got {dtype_name!r}")
    if not 1 <= vectors <= 16 or not 1 <= vector_lanes <= 64:
        raise ValueError(f"vectors must be in [1, 16], lanes in [1, 64]: {vectors}, {vector_lanes}")
    numba_type = _NUMBA_FLOAT[dtype_name]
    lanes = vector_lanes

    @intrinsic
    def tap_kernel(
        typingctx, taps, weights, weights_offset, offsets, inputs, inputs_offset, out,
        out_offset, count, bias, residual, residual_offset, activation, has_residual,
    ):  # fmt: skip
        for label, arg in (
            ("weights", weights), ("inputs", inputs), ("out", out), ("residual", residual)
        ):  # fmt: skip
            if not (isinstance(arg, types.Array) and arg.dtype == numba_type and arg.ndim == 1):
                raise TypeError(f"{label} must be a 1-D {dtype_name} array, got {arg}")
        if not (isinstance(offsets, types.Array) and offsets.dtype == types.intp):
            raise TypeError(f"offsets must be a 1-D intp array, got {offsets}")
        sig = types.void(
            types.intp, weights, types.intp, offsets, inputs, types.intp, out, types.intp,
            types.intp, numba_type, residual, types.intp, types.intp, types.boolean,
        )  # fmt: skip

        def codegen(context, builder, signature, args):
            (taps_v, w_a, w_off, o_a, in_a, in_off, out_a, out_off, count_v, bias_v,
             res_a, res_off, activation_v, has_residual_v) = args  # fmt: skip
            arrays = signature.args

            def data(index, value):
                return context.make_array(arrays[index])(context, builder, value).data

            intp = context.get_value_type(types.intp)
            element = _LLVM_FLOAT[dtype_name]()
            vector = ir.VectorType(element, lanes)
            i32 = ir.IntType(32)
            fma = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(vector, [vector] * 3),
                f"llvm.fma.v{lanes}{_SUFFIX[dtype_name]}",
            )
            undef = ir.Constant(vector, ir.Undefined)
            zeros_i32 = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)

            def broadcast(scalar):
                one = builder.insert_element(undef, scalar, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, undef, zeros_i32)

            weights_base = builder.gep(data(1, w_a), [w_off])
            offsets_base = data(3, o_a)
            inputs_base = builder.gep(data(4, in_a), [in_off])
            out_base = builder.gep(data(6, out_a), [out_off])
            residual_base = builder.gep(data(10, res_a), [res_off])
            align = 4 if dtype_name == "float32" else 8
            start = broadcast(bias_v)

            entry = builder.basic_block
            loop = builder.append_basic_block("taps.loop")
            done = builder.append_basic_block("taps.done")
            builder.cbranch(builder.icmp_signed(">", taps_v, ir.Constant(intp, 0)), loop, done)
            builder.position_at_end(loop)
            index = builder.phi(intp)
            index.add_incoming(ir.Constant(intp, 0), entry)
            accumulators = []
            for _ in range(vectors):
                phi = builder.phi(vector)
                phi.add_incoming(start, entry)
                accumulators.append(phi)
            weight = broadcast(builder.load(builder.gep(weights_base, [index])))
            row = builder.gep(inputs_base, [builder.load(builder.gep(offsets_base, [index]))])
            updated = []
            for v, accumulator in enumerate(accumulators):
                address = builder.bitcast(
                    builder.gep(row, [ir.Constant(intp, v * lanes)]), vector.as_pointer()
                )
                value = builder.load(address, align=align)
                updated.append(builder.call(fma, [weight, value, accumulator]))
            following = builder.add(index, ir.Constant(intp, 1))
            index.add_incoming(following, loop)
            for phi, value in zip(accumulators, updated):
                phi.add_incoming(value, loop)
            builder.cbranch(builder.icmp_signed("<", following, taps_v), loop, done)
            builder.position_at_end(done)
            results = []
            for v in range(vectors):
                phi = builder.phi(vector)
                phi.add_incoming(start, entry)
                phi.add_incoming(updated[v], loop)
                results.append(phi)
            # Masked write-back of the first `count` outputs.
            mask_type = ir.VectorType(ir.IntType(1), lanes)
            store = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), i32, mask_type]),
                f"llvm.masked.store.v{lanes}{_SUFFIX[dtype_name]}.p0",
            )
            lane_index = ir.Constant(ir.VectorType(intp, lanes), list(range(lanes)))
            intp_undef = ir.Constant(ir.VectorType(intp, lanes), ir.Undefined)
            zeros_intp_mask = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            masks = []
            for v in range(vectors):
                remaining = builder.sub(count_v, ir.Constant(intp, v * lanes))
                splat = builder.shuffle_vector(
                    builder.insert_element(intp_undef, remaining, ir.Constant(i32, 0)),
                    intp_undef,
                    zeros_intp_mask,
                )
                masks.append(builder.icmp_signed("<", lane_index, splat))
            load = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(vector, [vector.as_pointer(), i32, mask_type, vector]),
                f"llvm.masked.load.v{lanes}{_SUFFIX[dtype_name]}.p0",
            )

            def address(base, v):
                return builder.bitcast(
                    builder.gep(base, [ir.Constant(intp, v * lanes)]), vector.as_pointer()
                )

            def residual_of(v):
                zero = ir.Constant(vector, [0.0] * lanes)
                return builder.call(
                    load, [address(residual_base, v), ir.Constant(i32, align), masks[v], zero]
                )

            results = emit_epilogue(builder, results, residual_of, activation_v, has_residual_v)
            for v, value in enumerate(results):
                builder.call(
                    store, [value, address(out_base, v), ir.Constant(i32, align), masks[v]]
                )
            return context.get_dummy_value()

        return sig, codegen

    return tap_kernel
