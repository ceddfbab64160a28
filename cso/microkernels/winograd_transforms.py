"""LLVM vector IR for the Winograd F(2x2, 3x3) transforms, a vector of tiles at a time.

Layout contract (what the generated kernels read and write)
-----------------------------------------------------------
Every array is 1-D, addressed as ``array data + element offset``; ``VL``
is the vector's lanes; position ``e = 4*i + j`` of a 4x4 transformed tile
lives in plane ``e`` of ``U``, ``V`` or ``M``, ``stride`` elements after
plane ``e - 1``.

* ``input_tiles(x, row_offset, rows_valid, first_column, width, v, v_offset,
  stride)``: for the ``VL`` horizontally adjacent tiles whose 4x4 input
  blocks start at column ``first_column + 2t`` (``t < VL``) of the four
  rows ``x[row_offset + a*width ...]`` (``a < 4``), writes ``V = B^T d B``
  to ``v[v_offset + e*stride + t]``, whole vectors.  Row ``a`` is read
  only where bit ``a`` of ``rows_valid`` is set, column ``q`` only where
  ``0 <= q < width``; elsewhere ``d`` is zero (the padding).
* ``output_tiles(m, m_offset, stride, y, y_offset, row_stride, columns,
  two_rows, bias, residual, activation, has_residual)``: from
  ``M[e] = m[m_offset + e*stride + t]`` writes ``A^T M A + bias``, with the
  fused epilogue (:mod:`.epilogue`), as output rows: row 0 to
  ``y[y_offset + q]``, row 1 to ``y[y_offset + row_stride + q]`` (only if
  ``two_rows``), ``q < columns`` (``columns <= 2*VL``); the residual in
  ``y``'s layout.
* ``filter_tiles(w, w_offset, count, u, u_offset, stride)``: for the
  ``count <= VL`` filters whose 3x3 taps are ``w[w_offset + 9i ...]``
  (``i < count``: consecutive input channels of one filter, KCRS),
  writes ``U = G g G^T`` to ``u[u_offset + e*stride + i]``.

The matrices (Lavin and Gray, 2016)::

    B^T = [1  0 -1  0]     G = [1    0    0 ]     A^T = [1  1  1  0]
          [0  1  1  0]         [1/2  1/2  1/2]           [0  1 -1 -1]
          [0 -1  1  0]         [1/2 -1/2  1/2]
          [0  1  0 -1]         [0    0    1 ]

The input tiles' columns are split into even and odd ones by two
shuffles of two vectors each (``d0, d2`` even, ``d1, d3`` odd); the output
rows are interleaved back the same way.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .epilogue import emit_epilogue
from .vector_ir import I32, KernelEmitter, check_dtype_and_lanes, check_float_arrays

I64 = ir.IntType(64)
_ELEMENT_BYTES = {"float32": 4, "float64": 8}


def _splat(builder, value, lanes: int):
    """``value`` in every lane of a vector."""
    undef = ir.Constant(ir.VectorType(value.type, lanes), ir.Undefined)
    single = builder.insert_element(undef, value, ir.Constant(I32, 0))
    return builder.shuffle_vector(
        single, undef, ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
    )


def _inside(builder, start, limit, lanes: int):
    """The mask of lanes ``i`` with ``0 <= start + i < limit``: one unsigned
    compare (a negative position wraps above any limit)."""
    positions = builder.add(
        _splat(builder, builder.trunc(start, I32), lanes),
        ir.Constant(ir.VectorType(I32, lanes), list(range(lanes))),
    )
    return builder.icmp_unsigned("<", positions, _splat(builder, builder.trunc(limit, I32), lanes))


def _plane(emitter, stride, e: int):
    """Plane ``e``'s offset: ``e * stride``."""
    return emitter.builder.mul(stride, emitter.constant(e))


def _lane_indices(indices) -> ir.Constant:
    """A shuffle's lane indices as an IR constant."""
    indices = list(indices)
    return ir.Constant(ir.VectorType(I32, len(indices)), indices)


@functools.lru_cache(maxsize=None)
def build_input_tiles(dtype_name: str, vector_lanes: int):
    """The input transform of ``vector_lanes`` tiles (see the module docstring)."""
    check_dtype_and_lanes(dtype_name, vector_lanes)
    lanes = vector_lanes
    element_bytes = _ELEMENT_BYTES[dtype_name]

    @intrinsic
    def input_tiles(typingctx, x, row_offset, rows_valid, first_column, width, v, v_offset, stride):
        check_float_arrays(dtype_name, x=x, v=v)
        sig = types.void(x, types.intp, types.intp, types.intp, types.intp, v, types.intp,
                         types.intp)  # fmt: skip

        def codegen(context, b, signature, args):
            x_a, row0, valid, q0, width_v, v_a, v_off, stride_v = args
            e = KernelEmitter(context, b, signature, dtype_name, lanes)
            align = ir.Constant(I32, element_bytes)
            x_base, v_base = e.base(0, x_a, row0), e.base(5, v_a, v_off)
            even = _lane_indices(range(0, 2 * lanes, 2))
            odd = _lane_indices(range(1, 2 * lanes, 2))
            # Columns q0 + 2t + j: j = 0, 1 from the vectors at q0 and q0 + VL,
            # j = 2, 3 from those two columns further on.
            shifts = (0, lanes, 2, lanes + 2)
            column_masks = [_inside(b, b.add(q0, ir.Constant(I64, s)), width_v, lanes)
                            for s in shifts]  # fmt: skip
            rows = []
            for a in range(4):
                bit = b.icmp_signed(
                    "!=", b.and_(valid, ir.Constant(I64, 1 << a)), ir.Constant(I64, 0)
                )
                row = b.mul(width_v, e.constant(a))
                parts = []
                for shift, column_mask in zip(shifts, column_masks):
                    pointer = e.vector_at(x_base, b.add(row, b.add(q0, e.constant(shift))))
                    mask = e.masked_by(column_mask, bit)
                    parts.append(b.call(e.masked_load, [pointer, align, mask, e.zero]))
                d0 = b.shuffle_vector(parts[0], parts[1], even)
                d1 = b.shuffle_vector(parts[0], parts[1], odd)
                d2 = b.shuffle_vector(parts[2], parts[3], even)
                d3 = b.shuffle_vector(parts[2], parts[3], odd)
                # d B: the row's four transformed columns.
                rows.append((b.fsub(d0, d2), b.fadd(d1, d2), b.fsub(d2, d1), b.fsub(d1, d3)))
            for j in range(4):
                z0, z1, z2, z3 = (rows[a][j] for a in range(4))
                # B^T (d B): down the four rows.
                for i, value in enumerate(
                    (b.fsub(z0, z2), b.fadd(z1, z2), b.fsub(z2, z1), b.fsub(z1, z3))
                ):
                    pointer = e.vector_at(v_base, _plane(e, stride_v, 4 * i + j))
                    b.store(value, pointer, align=element_bytes)
            return context.get_dummy_value()

        return sig, codegen

    return input_tiles


@functools.lru_cache(maxsize=None)
def build_output_tiles(dtype_name: str, vector_lanes: int):
    """The output transform of ``vector_lanes`` tiles, with bias and epilogue
    (see the module docstring)."""
    check_dtype_and_lanes(dtype_name, vector_lanes)
    lanes = vector_lanes
    element_bytes = _ELEMENT_BYTES[dtype_name]

    @intrinsic
    def output_tiles(typingctx, m, m_offset, stride, y, y_offset, row_stride, columns, two_rows,
                     bias, residual, activation, has_residual):  # fmt: skip
        check_float_arrays(dtype_name, m=m, y=y, residual=residual)
        sig = types.void(m, types.intp, types.intp, y, types.intp, types.intp, types.intp,
                         types.boolean, y.dtype, residual, types.intp, types.boolean)  # fmt: skip

        def codegen(context, b, signature, args):
            m_a, m_off, stride_v, y_a, y_off, row_v, columns_v, two, bias_v, r_a, act, has_r = args
            e = KernelEmitter(context, b, signature, dtype_name, lanes)
            align = ir.Constant(I32, element_bytes)
            # The residual has the output's layout: the same offsets from its own base.
            m_base, y_base = e.base(0, m_a, m_off), e.base(3, y_a, y_off)
            r_base = e.base(9, r_a, y_off)
            planes = [
                b.load(e.vector_at(m_base, _plane(e, stride_v, k)), align=element_bytes)
                for k in range(16)
            ]
            # A^T M: the two output rows' four columns.
            top = [b.fadd(b.fadd(planes[j], planes[4 + j]), planes[8 + j]) for j in range(4)]
            bottom = [
                b.fsub(b.fsub(planes[4 + j], planes[8 + j]), planes[12 + j]) for j in range(4)
            ]
            bias_vector = e.broadcast(bias_v)
            # Interleaving a row's even (first) and odd (second) outputs.
            first_half = _lane_indices(i // 2 + (lanes if i % 2 else 0) for i in range(lanes))
            second_half = _lane_indices(lanes // 2 + i // 2 + (lanes if i % 2 else 0)
                                        for i in range(lanes))  # fmt: skip
            values, offsets = [], []
            for r, t in enumerate((top, bottom)):
                # (A^T M) A, plus the bias.
                left = b.fadd(b.fadd(b.fadd(t[0], t[1]), t[2]), bias_vector)
                right = b.fadd(b.fsub(b.fsub(t[1], t[2]), t[3]), bias_vector)
                row = b.mul(row_v, e.constant(r))
                values += [b.shuffle_vector(left, right, first_half),
                           b.shuffle_vector(left, right, second_half)]  # fmt: skip
                offsets += [row, b.add(row, e.constant(lanes))]

            def residual_of(index):
                return b.load(e.vector_at(r_base, offsets[index]), align=element_bytes)

            finals = emit_epilogue(b, values, residual_of, act, has_r)
            for index, value in enumerate(finals):
                mask = e.lanes_below(b.sub(columns_v, e.constant((index % 2) * lanes)))
                if index >= 2:
                    mask = e.masked_by(mask, two)
                pointer = e.vector_at(y_base, offsets[index])
                b.call(e.masked_store, [value, pointer, align, mask])
            return context.get_dummy_value()

        return sig, codegen

    return output_tiles


@functools.lru_cache(maxsize=None)
def build_filter_tiles(dtype_name: str, vector_lanes: int):
    """The filter transform of up to ``vector_lanes`` filters (see the module docstring)."""
    check_dtype_and_lanes(dtype_name, vector_lanes)
    lanes = vector_lanes
    element_bytes = _ELEMENT_BYTES[dtype_name]
    suffix = f"v{lanes}{'f32' if dtype_name == 'float32' else 'f64'}"

    @intrinsic
    def filter_tiles(typingctx, w, w_offset, count, u, u_offset, stride):
        check_float_arrays(dtype_name, w=w, u=u)
        sig = types.void(w, types.intp, types.intp, u, types.intp, types.intp)

        def codegen(context, b, signature, args):
            w_a, w_off, count_v, u_a, u_off, stride_v = args
            e = KernelEmitter(context, b, signature, dtype_name, lanes)
            vector = e.vector
            pointers = ir.VectorType(vector.element.as_pointer(), lanes)
            mask_type = ir.VectorType(ir.IntType(1), lanes)
            gather = cgutils.get_or_insert_function(
                b.module, ir.FunctionType(vector, [pointers, I32, mask_type, vector]),
                f"llvm.masked.gather.{suffix}.v{lanes}p0",
            )  # fmt: skip
            mask = e.lanes_below(count_v)
            align = ir.Constant(I32, element_bytes)
            u_base = e.base(3, u_a, u_off)
            # The 16 filters' addresses for a gather: the first's, splatted, plus each one's.
            base = _splat(b, b.ptrtoint(e.base(0, w_a, w_off), I64), lanes)
            taps = []
            for tap in range(9):
                offsets = ir.Constant(
                    ir.VectorType(I64, lanes), [(9 * i + tap) * element_bytes for i in range(lanes)]
                )
                addresses = b.inttoptr(b.add(base, offsets), pointers)
                taps.append(b.call(gather, [addresses, align, mask, e.zero]))
            half = ir.Constant(vector, [0.5] * lanes)

            def g_times(a0, a1, a2):
                ends = b.fadd(a0, a2)
                return (a0, b.fmul(half, b.fadd(ends, a1)), b.fmul(half, b.fsub(ends, a1)), a2)

            # G g: each of the three columns down its rows, then (G g) G^T along each row.
            columns = [g_times(taps[j], taps[3 + j], taps[6 + j]) for j in range(3)]
            for i in range(4):
                for j, value in enumerate(g_times(columns[0][i], columns[1][i], columns[2][i])):
                    pointer = e.vector_at(u_base, _plane(e, stride_v, 4 * i + j))
                    b.call(e.masked_store, [value, pointer, align, mask])
            return context.get_dummy_value()

        return sig, codegen

    return filter_tiles
