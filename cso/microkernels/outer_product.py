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

Where the code is: this module builds the kernel (its signature and
checks); :mod:`.outer_product_emitter` writes the reduction loop,
:mod:`.tile_stores` the write-back, :mod:`.dot_products` the reduction
orientation.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ..analysis.hardware import KERNEL_PREFETCH_DISTANCE
from ..analysis.choices import VectorOperand, parse_choice
from .dot_products import emit_dot_products
from .outer_product_emitter import OuterProductEmitter

_DTYPES = ("float32", "float64")
_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}
# The operands a caller may pass as the address of an array's data.
_ADDRESSABLE = ("filters", "inputs", "out")


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
    prefetch_distance: int = KERNEL_PREFETCH_DISTANCE,
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
        prefetch their contiguous operand rows into L1; 0 for none
        (default ``Hardware.kernel_prefetch_distance``'s).  A row shorter than a cache
        line is not prefetched
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
    if dtype_name not in _DTYPES:
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
            emitter = OuterProductEmitter(
                context, builder, signature, args, dtype_name, vector_lanes
            )
            if vector_operand == VectorOperand.REDUCTION:
                emit_dot_products(emitter, broadcasts, vectors)
            else:
                emitter.emit(vector_operand, broadcasts, vectors, distance, transposed_store)
            return context.get_dummy_value()

        return sig, codegen

    return outer_product_kernel
