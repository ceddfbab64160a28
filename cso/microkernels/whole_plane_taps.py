"""LLVM vector IR for stride-1 depthwise convolutions of small planes: a
whole output plane a call, its taps made by shifting loaded vectors.

Why shifts, not loads
---------------------
At stride 1 with ``Q == W`` (:mod:`.plane_taps`), tap ``(r, s)`` of output
pixel ``f`` reads input pixel ``f + delta`` of the flattened plane, with
``delta = r*dh*W + s*dw`` counted from the call's ``in_offset`` (the
plane's start less ``pad_top*W + pad_left``).  Write ``delta = k*VL + m``
(``0 <= m < VL``): the tap's vector for output vector ``u`` is then lanes
``m .. m + VL`` of the two loaded vectors ``G[u + k], G[u + k + 1]``, where
``G[j]`` is the whole vector at ``in_offset + j*VL``: one two-source shuffle
(AVX-512's ``valignd``), and each ``G[j]`` is loaded once for every tap and
output vector that needs it.  :mod:`.plane_taps` loads each tap's vector
unaligned, ``R*S`` loads an output vector most of which split two cache
lines; on an AMD EPYC (Zen 5), one thread, MobileNetV2's ``dw 3x3 960 @7``
ran 2.0x faster so (same masks, whole plane a call, in a prototype nest).

Why a whole plane, its geometry fixed
-------------------------------------
The kernel is generated for one plane's geometry (``H, W``, padding), so
which taps fall off the plane is known when it is built: a tap off the
plane in every lane a vector stores is not emitted
(:func:`cso.analysis.planes.tap_coverage`), and no tap is masked.  Instead
each loaded vector is anded, once for all the taps of one column shift
``d = s*dw - pad_left``, with a constant mask clearing the elements
outside the plane and those such a tap reaches only by wrapping round a
row (:func:`cso.analysis.planes.grid_masks`): then every lane a tap may not
read is already zero.  With one call a plane nothing is found at run time
but the plane's address.  Each output vector's ``R*S`` taps are one chain
of FMAs, stored as soon as it ends, so that only one vector's sum is live.
On the Zen 5, ``dw 3x3 384 @14`` (13 vectors a plane) ran 1.46x faster
with taps skipped and the stores so than with every tap masked and the
stores at the end (11.3 against 16.6 us in a prototype nest; 20.9 for the
row plan), and the masks on the loaded vectors rather than on each cut
tap (76 taps anded a plane there, 25 ands in the machine code after) ran
`384 @14` in 13.3 us against 14.4 and `576 @14` in 17.2 against 19.9
(runs minutes apart, the row plans' times alike in both).

Contract
--------
The edge kernel's of :mod:`.plane_taps`, for ``U`` = all of a plane's
output vectors in one call (``v0 = 0``, ``ends_plane`` ignored: the last
vector always stores its first ``tail_lanes``)::

    out[out_offset + u*VL + l] = bias + sum_{r < R, s < S}
        filters[w_offset + r*S + s]
        * (inputs[in_offset + u*VL + l + r*dh*W + s*dw]  where the tap's lane is on the plane,
           else 0)

then the fused epilogue (:mod:`.epilogue`), applied to
:data:`EPILOGUE_VECTORS` output vectors at a time.  The mask-table
arguments are not read.  The loads reach ``G[j]`` for ``j`` up to
:func:`cso.analysis.planes.grid_vectors` - 1: every element from
``in_offset`` to ``in_offset + grid_vectors*VL`` must lie in the input (the
nest checks; elsewhere it calls the masked kernel of :mod:`.plane_taps`).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba.extending import intrinsic

from ..analysis.planes import grid_masks, plane_geometry, tap_coverage, tap_shifts
from .epilogue import emit_epilogue
from .plane_taps import plane_kernel_signature
from .vector_ir import (
    I32,
    KernelEmitter,
    check_bit_set_lanes,
    check_dtype_and_lanes,
    check_shape_bounds,
    store_leading_lanes,
)


# Output vectors a fused epilogue is applied to at once.
EPILOGUE_VECTORS = 4


@functools.lru_cache(maxsize=None)
def build_whole_plane_kernel(plane: tuple, dtype_name: str, vector_lanes: int):
    """Return a Numba intrinsic computing one whole output plane of
    the planes ``plane`` describes (stride 1, ``Q == W``:
    :func:`~cso.analysis.plane_shapes.is_plane_depthwise`).

    Parameters
    ----------
    plane : tuple
        ``(R, S, dh, dw, H, W, pad_top, pad_bottom, pad_left, pad_right)``
        (:func:`cso.analysis.planes.plane_key`): the kernel is built for them.
    dtype_name : {"float32", "float64"}
    vector_lanes : int
        At most 32 (the nest's masks are int32 bit sets).

    Returns
    -------
    intrinsic
        With :func:`cso.microkernels.plane_taps.build_plane_tap_kernel`'s
        arguments: ``kernel(inputs, in_offset, width, filters, w_offset,
        masks, mask_offset, column_offset, ends_plane, out, out_offset, bias,
        bias_index, has_bias, residual, residual_offset, activation,
        has_residual)``; the mask-table arguments are not read.
    """
    g = plane_geometry(tuple(plane))
    check_dtype_and_lanes(dtype_name, vector_lanes)
    check_bit_set_lanes(vector_lanes)
    check_shape_bounds(
        ("kernel_height", g.kernel_height, 64), ("kernel_width", g.kernel_width, 64),
        ("dilation_h", g.dilation_h, 64), ("dilation_w", g.dilation_w, 64),
    )  # fmt: skip
    if not (g.stride_h == g.stride_w == 1 and g.out_width == g.width):
        raise ValueError(f"a whole-plane kernel needs stride 1 and Q == W, got {g}")
    lanes = vector_lanes
    taps = g.kernel_height * g.kernel_width
    coverage = tap_coverage(g, lanes)  # [u][t]: 0 off the plane, 1 all on it, 2 some lanes
    vectors = len(coverage)
    tail_lanes = (g.out_height * g.out_width) % lanes
    shifts = tap_shifts(g, lanes)  # [t]: (k, m, d), shift k*VL + m, column shift d
    keep = grid_masks(g, lanes)

    @intrinsic
    def whole_plane_kernel(
        typingctx, inputs, in_offset, width, filters, w_offset, masks, mask_offset,
        column_offset, ends_plane, out, out_offset, bias, bias_index, has_bias, residual,
        residual_offset, activation, has_residual,
    ):  # fmt: skip
        sig = plane_kernel_signature(dtype_name, inputs, filters, masks, out, bias, residual)

        def codegen(context, builder, signature, args):
            (in_a, in_off, _width, w_a, w_off, _masks, _m_off, _col_off, _ends, out_a, out_off,
             bias_a, bias_i, has_bias_v, res_a, res_off, activation_v,
             has_residual_v) = args  # fmt: skip
            e = KernelEmitter(context, builder, signature, dtype_name, lanes)
            b = builder
            inputs_base = e.base(0, in_a, in_off)
            filters_base = e.base(3, w_a, w_off)
            out_base = e.base(9, out_a, out_off)
            # Without a bias the bias operand is a one-element placeholder:
            # its element 0 is read (and not used), never the filter's index.
            bias_base = e.base(11, bias_a, b.select(has_bias_v, bias_i, e.constant(0)))
            residual_base = e.base(14, res_a, res_off)
            zero = ir.Constant(e.vector.element, 0.0)
            start = e.broadcast(b.select(has_bias_v, b.load(bias_base), zero))
            weights = [
                e.broadcast(b.load(b.gep(filters_base, [e.constant(t)]))) for t in range(taps)
            ]

            integer = ir.VectorType(ir.IntType(e.element_bytes * 8), lanes)
            zero_vector = ir.Constant(e.vector, [0.0] * lanes)

            def masked(grid, j, d):
                """Loaded vector ``j`` with the lanes a tap of column shift ``d``
                may not read zeroed (:func:`~cso.analysis.planes.grid_masks`),
                loaded and masked once for every tap of that shift."""
                if (j, d) not in grid:
                    lanes_kept = keep[d][j]
                    if not lanes_kept.any():
                        grid[j, d] = zero_vector
                    else:
                        if j not in grid:
                            grid[j] = e.load(inputs_base, e.constant(j * lanes))
                        grid[j, d] = grid[j]
                        if not lanes_kept.all():
                            bits = ir.Constant(integer, [-1 if k else 0 for k in lanes_kept])
                            as_bits = b.and_(b.bitcast(grid[j], integer), bits)
                            grid[j, d] = b.bitcast(as_bits, e.vector)
                return grid[j, d]

            def output_vector(u, grid):
                """Output vector ``u``'s chain of FMAs over the taps on the plane."""
                total = start
                for t, (k, m, d) in enumerate(shifts):
                    if coverage[u][t] == 0:
                        continue
                    value = masked(grid, u + k, d)
                    if m:
                        picks = ir.Constant(ir.VectorType(I32, lanes), list(range(m, m + lanes)))
                        value = b.shuffle_vector(value, masked(grid, u + k + 1, d), picks)
                    total = b.call(e.fma, [value, weights[t], total])
                return total

            def residual_of(u):
                mask = None
                if u == vectors - 1 and tail_lanes:
                    bits = [1] * tail_lanes + [0] * (lanes - tail_lanes)
                    mask = ir.Constant(ir.VectorType(ir.IntType(1), lanes), bits)
                return e.load(residual_base, e.constant(u * lanes), mask)

            def store(u, value):
                if u == vectors - 1 and tail_lanes:
                    address = b.gep(out_base, [e.constant(u * lanes)])
                    store_leading_lanes(b, value, address, tail_lanes, e.element_bytes)
                else:
                    e.store(value, out_base, e.constant(u * lanes))

            plain = b.and_(
                b.not_(has_residual_v),
                b.icmp_signed("==", activation_v, ir.Constant(activation_v.type, 0)),
            )
            with b.if_else(plain) as (no_epilogue, epilogue):
                with no_epilogue:
                    grid = {}
                    for u in range(vectors):
                        store(u, output_vector(u, grid))
                with epilogue:
                    # A few vectors' sums at a time through the epilogue: all of a
                    # plane's kept until the end spilled (28x28 planes 1.5x slower).
                    grid = {}
                    for first in range(0, vectors, EPILOGUE_VECTORS):
                        chunk = range(first, min(vectors, first + EPILOGUE_VECTORS))
                        sums = [output_vector(u, grid) for u in chunk]
                        finished = emit_epilogue(
                            b, sums, lambda i: residual_of(first + i), activation_v,
                            has_residual_v,
                        )  # fmt: skip
                        for u, value in zip(chunk, finished):
                            store(u, value)
            return context.get_dummy_value()

        return sig, codegen

    return whole_plane_kernel
