"""LLVM IR pieces every generated kernel shares: the float vector type, the
FMA and masked-memory intrinsics, run-time lane masks, the in-register
transpose.

The kernels (:mod:`.outer_product`, :mod:`.taps`, :mod:`.lane_taps`,
:mod:`.epilogue`) emit their own loops; what they declare, check and build
the same way lives here once.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

_LLVM_FLOAT = {"float32": ir.FloatType, "float64": ir.DoubleType}
_SUFFIX = {"float32": "f32", "float64": "f64"}

I32 = ir.IntType(32)


def check_float_arrays(dtype_name: str, **arrays) -> None:
    """At typing: raise TypeError unless each named argument is a 1-D
    ``dtype_name`` array (the kernels' float operands)."""
    numba_type = getattr(types, dtype_name)
    for label, arg in arrays.items():
        if not (isinstance(arg, types.Array) and arg.dtype == numba_type and arg.ndim == 1):
            raise TypeError(f"{label} must be a 1-D {dtype_name} array, got {arg}")


def vector_type(dtype_name: str, lanes: int) -> ir.VectorType:
    """``<lanes x float>`` or ``<lanes x double>``."""
    return ir.VectorType(_LLVM_FLOAT[dtype_name](), lanes)


def _suffix(vector: ir.VectorType) -> str:
    element = "f32" if isinstance(vector.element, ir.FloatType) else "f64"
    return f"v{vector.count}{element}"


def fma_function(module, vector: ir.VectorType):
    """``llvm.fma`` on ``vector``: ``fma(a, b, c) = a * b + c``, one rounding."""
    return cgutils.get_or_insert_function(
        module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.{_suffix(vector)}"
    )


def masked_load_function(module, vector: ir.VectorType):
    """``llvm.masked.load`` of ``vector``: ``load(pointer, align, mask, passthrough)``."""
    mask = ir.VectorType(ir.IntType(1), vector.count)
    return cgutils.get_or_insert_function(
        module,
        ir.FunctionType(vector, [vector.as_pointer(), I32, mask, vector]),
        f"llvm.masked.load.{_suffix(vector)}.p0",
    )


def masked_store_function(module, vector: ir.VectorType):
    """``llvm.masked.store`` of ``vector``: ``store(value, pointer, align, mask)``."""
    mask = ir.VectorType(ir.IntType(1), vector.count)
    return cgutils.get_or_insert_function(
        module,
        ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), I32, mask]),
        f"llvm.masked.store.{_suffix(vector)}.p0",
    )


def lanes_below(builder, count, lanes: int):
    """The ``<lanes x i1>`` mask of lanes ``j < count``, ``count`` an integer
    IR value known at run time only."""
    index_type = ir.VectorType(count.type, lanes)
    undef = ir.Constant(index_type, ir.Undefined)
    splat = builder.shuffle_vector(
        builder.insert_element(undef, count, ir.Constant(I32, 0)),
        undef,
        ir.Constant(ir.VectorType(I32, lanes), [0] * lanes),
    )
    return builder.icmp_signed("<", ir.Constant(index_type, list(range(lanes))), splat)


def transpose(builder, rows) -> list:
    """``rows[j][i] -> result[i][j]`` for ``VL`` vectors of ``VL`` lanes.

    Round ``d`` (``VL/2, .., 1``) swaps the ``d x d`` blocks off the
    diagonal of every ``2d x 2d`` block: ``log2 VL`` rounds of ``VL``
    two-vector shuffles."""
    lanes = len(rows)
    rows = list(rows)
    step = lanes // 2
    while step:
        upper = ir.Constant(
            ir.VectorType(I32, lanes),
            [lanes + c - step if c & step else c for c in range(lanes)],
        )
        lower = ir.Constant(
            ir.VectorType(I32, lanes),
            [lanes + c if c & step else c + step for c in range(lanes)],
        )
        for r in range(lanes):
            if not r & step:
                a, b = rows[r], rows[r + step]
                rows[r] = builder.shuffle_vector(a, b, upper)
                rows[r + step] = builder.shuffle_vector(a, b, lower)
        step //= 2
    return rows
