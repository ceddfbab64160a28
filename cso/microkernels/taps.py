"""LLVM vector IR for the tap micro-kernel of depthwise convolutions.

Why a block of rows
-------------------
A depthwise layer's reduction is only ``R*S`` taps: a kernel that keeps one
row segment in registers loads one input vector per multiply-add, and runs
at the loads' rate, not the FMAs' (on an AMD EPYC Zen 4, a 3x3 layer of
144 channels at 56x56 ran at 26% of the FMA peak that way).  This kernel
holds ``rows`` output rows of ``vectors`` vectors each in registers.  An
input vector of packed row ``i`` at column tap ``s`` is loaded once and
feeds every output row ``pb`` of the block with a filter row ``r`` such that
``pb * stride_h + r * dilation_h == i``: ``R`` multiply-adds per load in the
middle of the block instead of one.  The ``R`` weights of the current
column tap are broadcast once into registers.

Why several filters a call
--------------------------
A grouped layer's ``m`` filters all read the same packed group: a kernel of
one filter loads every input vector ``m`` times.  With ``F`` filters a call
each loaded vector feeds ``F`` filters' accumulators (the ``F * R`` weights
of a column tap broadcast): on a Xeon, ResNeXt-50's grouped 3x3 layers ran
1.18-1.55x faster with the analysis' ``F`` than with one filter a call, the
strided ones most (`experiments/grouped_families.py`).

Packed-layout contract
----------------------
One call computes ``F x rows x count`` outputs::

    out[out_offset + f * filter_pitch + pb * out_pitch + j]
        = bias[bias_offset + f * bias_step]
          + sum_{r < R, t < T} weights[weights_offset + f * filter_stride
                                       + column_offsets[T + r*T + t]]
              * inputs[inputs_offset + (pb * stride_h + r * dilation_h) * width
                       + column_offsets[t] + j]

for ``f < F``, ``pb < rows`` and ``j < count``, then the fused epilogue in
registers (:mod:`.epilogue`), the residual in the output's layout
(``residual_offset + f * filter_pitch + pb * out_pitch + j``).  ``R``,
``stride_h``, ``dilation_h``, ``rows``, ``vectors``, ``masked_rows`` and
``F`` (``filters``) are the kernel's shape; ``T`` (``columns``), the
packed row pitch ``width``, the pitches and the offsets are arguments (a
``bias_step`` of 0 reads one bias for every filter: a zero, without a
bias): ``column_offsets``
holds ``T`` input offsets, then ``R * T`` weight offsets (so that the
filters are read in place in any layout: a grouped layer's column taps run
over its channels too, ``t = c*S + s``, and its KCRS weights are not ``r*T
+ t`` apart).  The
packing (:mod:`cso.packing.depthwise`) makes every load of ``rows`` rows and
``vectors * VL`` columns in bounds.

Nothing branches on an edge, and stores are whole vectors where they can
be: masked stores are slow where they are microcoded (on an AMD EPYC, Zen
4, a 3x3 layer of 144 channels at 56 x 64 ran 1.55x longer with its 14
stores a call masked than whole).

* ``masked_rows = 0`` (rows at least one segment wide): every store is
  whole, ``count`` is ``vectors * VL``.  The loop nest starts a row's last
  segment and a plane's last block of rows early enough to end at the edge,
  so that they overlap the ones before and compute some outputs twice, alike.
* ``masked_rows = k > 0`` (one vector, rows of ``count < VL``, ``out_pitch
  = count``): rows ``pb < rows - k`` store whole vectors, whose lanes past
  ``count`` run on into the rows after them, which are stored later, in
  order, with their own values (stores to one array are not reordered past
  each other); the last ``k`` rows, whose lanes could run past the plane,
  store ``count`` lanes.  The caller makes ``k`` at least ``ceil((VL -
  count) / count)``, and calls block after block down the plane.

The shape ``R = rows = 1`` serves every layer, whatever its filter height,
stride and dilation: its ``columns`` are all ``R*S`` taps, and each tap's
row is folded into its column offset (one load per multiply-add, as a
one-row kernel must).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..analysis.tap_layout import rows_read
from .epilogue import emit_epilogue
from .vector_ir import KernelEmitter, check_float_arrays, check_shape_bounds, keep_loop_rolled

_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}


def row_uses(rows: int, kernel_height: int, stride_h: int, dilation_h: int) -> list:
    """For each input row ``i`` of the block, the ``(pb, r)`` it feeds:
    ``pb * stride_h + r * dilation_h == i``."""
    uses = [[] for _ in range(rows_read(rows, kernel_height, stride_h, dilation_h))]
    for pb in range(rows):
        for r in range(kernel_height):
            uses[pb * stride_h + r * dilation_h].append((pb, r))
    return uses


@functools.lru_cache(maxsize=None)
def build_tap_kernel(
    kernel_height: int,
    stride_h: int,
    dilation_h: int,
    rows: int,
    vectors: int,
    dtype_name: str,
    vector_lanes: int,
    masked_rows: int = 0,
    filters: int = 1,
):
    """Return a Numba intrinsic computing ``rows x (vectors * VL)`` depthwise outputs.

    Parameters
    ----------
    kernel_height, stride_h, dilation_h : int
        ``R`` and the vertical stride and dilation: which input rows feed
        which output rows is unrolled at generation.
    rows, vectors : int
        Output rows and vectors per row held in registers (``rows *
        vectors`` accumulators).
    dtype_name : {"float32", "float64"}
    vector_lanes : int
        ``VL``, elements per vector.
    masked_rows : int
        The last rows, which store the first ``count`` lanes of each vector
        (the others store whole vectors; see the module docstring).
    filters : int
        ``F``, filters per call: each loaded input vector feeds every one
        (``filters * rows * vectors`` accumulators).

    Returns
    -------
    intrinsic
        Callable from ``@njit`` code as ``kernel(columns, weights,
        weights_offset, filter_stride, column_offsets, inputs, inputs_offset,
        width, out, out_offset, out_pitch, filter_pitch, count, bias,
        bias_offset, bias_step, residual, residual_offset, activation,
        has_residual)`` (see the module docstring).
    """
    if dtype_name not in _NUMBA_FLOAT:
        raise ValueError(f"dtype_name must be float32 or float64, got {dtype_name!r}")
    check_shape_bounds(
        ("kernel_height", kernel_height, 16), ("stride_h", stride_h, 16),
        ("dilation_h", dilation_h, 16), ("rows", rows, 16), ("vectors", vectors, 16),
        ("vector_lanes", vector_lanes, 64), ("masked_rows", masked_rows + 1, rows + 1),
        ("filters", filters, 32),
    )  # fmt: skip
    lanes = vector_lanes
    uses = row_uses(rows, kernel_height, stride_h, dilation_h)

    @intrinsic
    def tap_kernel(
        typingctx, columns, weights, weights_offset, filter_stride, column_offsets, inputs,
        inputs_offset, width, out, out_offset, out_pitch, filter_pitch, count, bias, bias_offset,
        bias_step, residual, residual_offset, activation, has_residual,
    ):  # fmt: skip
        check_float_arrays(
            dtype_name, weights=weights, inputs=inputs, out=out, bias=bias, residual=residual
        )
        if not (isinstance(column_offsets, types.Array) and column_offsets.dtype == types.intp):
            raise TypeError(f"column_offsets must be a 1-D intp array, got {column_offsets}")
        sig = types.void(
            types.intp, weights, types.intp, types.intp, column_offsets, inputs, types.intp,
            types.intp, out, types.intp, types.intp, types.intp, types.intp, bias, types.intp,
            types.intp, residual, types.intp, types.intp, types.boolean,
        )  # fmt: skip

        def codegen(context, builder, signature, args):
            (columns_v, w_a, w_off, fstride_v, c_a, in_a, in_off, width_v, out_a, out_off,
             pitch_v, fpitch_v, count_v, bias_a, bias_off, bias_step_v, res_a, res_off,
             activation_v, has_residual_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            vector, align, constant, vector_at = e.vector, e.align, e.constant, e.vector_at
            i32 = ir.IntType(32)
            undef = ir.Constant(vector, ir.Undefined)
            zeros_i32 = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)

            def broadcast(scalar):
                one = builder.insert_element(undef, scalar, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, undef, zeros_i32)

            weights_base = e.base(1, w_a, w_off)
            column_base = e.base(4, c_a, constant(0))
            weight_offsets_base = builder.gep(column_base, [columns_v])
            inputs_base = e.base(5, in_a, in_off)
            out_base = e.base(8, out_a, out_off)
            bias_base = e.base(13, bias_a, bias_off)
            residual_base = e.base(16, res_a, res_off)
            starts = [
                broadcast(
                    builder.load(builder.gep(bias_base, [builder.mul(constant(f), bias_step_v)]))
                )
                for f in range(filters)
            ]
            filter_bases = [
                builder.gep(weights_base, [builder.mul(constant(f), fstride_v)])
                for f in range(filters)
            ]
            row_starts = [builder.mul(constant(i), width_v) for i in range(len(uses))]
            keys = [
                (f, pb, v) for f in range(filters) for pb in range(rows) for v in range(vectors)
            ]

            # for s in range(columns): the F*R weights of column s broadcast, then
            # each input vector loaded once and fed to every (filter, output row) it reaches.
            entry = builder.basic_block
            loop = builder.append_basic_block("columns.loop")
            done = builder.append_basic_block("columns.done")
            builder.cbranch(builder.icmp_signed(">", columns_v, constant(0)), loop, done)
            builder.position_at_end(loop)
            column = builder.phi(e.intp)
            column.add_incoming(constant(0), entry)
            accumulators = {}
            for key in keys:
                phi = builder.phi(vector)
                phi.add_incoming(starts[key[0]], entry)
                accumulators[key] = phi
            weight_offsets = [
                builder.load(
                    builder.gep(
                        weight_offsets_base,
                        [builder.add(builder.mul(constant(r), columns_v), column)],
                    )
                )
                for r in range(kernel_height)
            ]
            weight = {
                (f, r): broadcast(builder.load(builder.gep(filter_bases[f], [weight_offsets[r]])))
                for f in range(filters)
                for r in range(kernel_height)
            }
            column_start = builder.load(builder.gep(column_base, [column]))
            updated = dict(accumulators)
            for i, feeds in enumerate(uses):
                row = builder.add(row_starts[i], column_start)
                for v in range(vectors):
                    address = vector_at(inputs_base, builder.add(row, constant(v * lanes)))
                    value = builder.load(address, align=align)
                    for f in range(filters):
                        for pb, r in feeds:
                            key = (f, pb, v)
                            updated[key] = builder.call(e.fma, [weight[f, r], value, updated[key]])
            following = builder.add(column, constant(1))
            column.add_incoming(following, loop)
            for key, phi in accumulators.items():
                phi.add_incoming(updated[key], loop)
            # Unrolled by LLVM (three columns a pass), the AVX2 kernel of 6 rows
            # kept a third of its accumulators on the stack; rolled, the tap
            # plans of EfficientNet-B0's and MobileNetV2's depthwise layers ran
            # 1.12x faster in total on a Zen 3 (1.0-1.27x a layer).
            keep_loop_rolled(
                builder.cbranch(builder.icmp_signed("<", following, columns_v), loop, done)
            )
            builder.position_at_end(done)
            results = []
            for key in keys:
                phi = builder.phi(vector)
                phi.add_incoming(starts[key[0]], entry)
                phi.add_incoming(updated[key], loop)
                results.append(phi)

            # The lanes stored: the first `count` of each row, or all of them.
            masks = {}
            for f, pb, v in keys:
                if pb < rows - masked_rows:
                    masks[f, pb, v] = ir.Constant(e.mask_type, [1] * lanes)
                    continue
                masks[f, pb, v] = e.lanes_below(builder.sub(count_v, constant(v * lanes)))
            offsets = {
                (f, pb, v): builder.add(
                    builder.add(
                        builder.mul(constant(f), fpitch_v), builder.mul(constant(pb), pitch_v)
                    ),
                    constant(v * lanes),
                )
                for f, pb, v in keys
            }

            def residual_of(index):
                key = keys[index]
                return e.load(residual_base, offsets[key], masks[key])

            results = emit_epilogue(builder, results, residual_of, activation_v, has_residual_v)
            for key, value in zip(keys, results):
                if key[1] >= rows - masked_rows:
                    e.store(value, out_base, offsets[key], masks[key])
                else:
                    builder.store(value, vector_at(out_base, offsets[key]), align=align)
            return context.get_dummy_value()

        return sig, codegen

    return tap_kernel
