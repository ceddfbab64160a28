"""The operators other than ``Conv``, in NumPy, as the ONNX specification defines them.

Each is ``operator(inputs, attributes) -> list of outputs``: ``inputs`` the
node's input arrays in order (None for an omitted optional input),
``attributes`` a dict of Python values (:func:`cso.onnx.graph.read_graph` decodes them).
The pooling operators are in :mod:`.pooling`.
:data:`OPERATORS` maps op types to them; a model that uses any other op
type is refused when its session is made.  Shape and element type follow
NumPy's rules, which are ONNX's for the types ONNX allows together.
"""

from __future__ import annotations

import math
import sys

import numba
import numpy as np

from ..numba_cache import guard_module
from .errors import OperatorError
from .pooling import average_pool, global_average_pool, max_pool


@numba.njit(cache=True, nogil=True)
def _erf_into(values, out):
    for index in range(values.size):
        out[index] = math.erf(values[index])


# A cached Numba function, its disk cache locked against other processes
# saving at once (cso.numba_cache; a numba.vectorize ufunc, as Erf was
# before, has no dispatcher to guard).
guard_module(sys.modules[__name__])


def _erf(x):
    """``erf`` elementwise, in float32 for the types that cast to it safely
    and float64 for the others, compiled by Numba; the result in ``x``'s
    type, as ONNX's ``Erf`` (``T -> T``) and ``onnx.reference`` give it."""
    x = np.asarray(x)
    if np.can_cast(x.dtype, np.float32):
        dtype = np.dtype(np.float32)
    elif np.can_cast(x.dtype, np.float64):
        dtype = np.dtype(np.float64)
    else:
        raise TypeError(f"Erf takes real numbers, got elements of {x.dtype}")
    values = np.ascontiguousarray(x, dtype=dtype).reshape(-1)
    out = np.empty(x.shape, dtype)
    _erf_into(values, out.reshape(-1))
    return out.astype(x.dtype, copy=False)


def _unary(function):
    def operator(inputs, attributes):
        return [function(inputs[0])]

    return operator


def _binary(function):
    def operator(inputs, attributes):
        return [function(inputs[0], inputs[1])]

    return operator


def _divide(a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        # ONNX's integer division truncates; NumPy's floor division rounds down.
        return np.trunc(np.true_divide(a, b)).astype(np.result_type(a, b))
    return np.divide(a, b)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)


def _clip(inputs, attributes):
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attributes.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attributes.get("max")
    if low is not None:
        x = np.maximum(x, np.asarray(low, dtype=x.dtype))
    if high is not None:
        x = np.minimum(x, np.asarray(high, dtype=x.dtype))
    return [x]


def _hard_sigmoid(inputs, attributes):
    x = inputs[0]
    alpha, beta = attributes.get("alpha", 0.2), attributes.get("beta", 0.5)
    return [np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype)]


def _hard_swish(inputs, attributes):
    x = inputs[0]
    return [x * np.clip(x / x.dtype.type(6) + x.dtype.type(0.5), 0, 1).astype(x.dtype)]


def _matmul(inputs, attributes):
    return [np.matmul(inputs[0], inputs[1])]


def _gemm(inputs, attributes):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attributes.get("transA", 0):
        a = a.T
    if attributes.get("transB", 0):
        b = b.T
    y = np.matmul(a, b)
    alpha, beta = attributes.get("alpha", 1.0), attributes.get("beta", 1.0)
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else c * c.dtype.type(beta))
    return [y.astype(np.result_type(inputs[0], inputs[1]), copy=False)]


def _axes(inputs, attributes, position=1):
    """The ``axes`` of a node: its input at ``position`` (newer opsets) or its
    attribute (older), or None."""
    if len(inputs) > position and inputs[position] is not None:
        return [int(a) for a in np.asarray(inputs[position]).reshape(-1)]
    axes = attributes.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _reduce_mean(inputs, attributes):
    x = inputs[0]
    axes = _axes(inputs, attributes)
    keepdims = bool(attributes.get("keepdims", 1))
    if not axes:
        if attributes.get("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.ndim))
    result = np.mean(x, axis=tuple(axes), keepdims=keepdims)
    return [np.asarray(result, dtype=x.dtype)]


def _concat(inputs, attributes):
    return [np.concatenate(inputs, axis=attributes["axis"])]


def _slice(inputs, attributes):
    x = inputs[0]
    if len(inputs) > 1:
        starts = np.asarray(inputs[1]).reshape(-1)
        ends = np.asarray(inputs[2]).reshape(-1)
        axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
        steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    else:  # opset < 10: attributes
        starts, ends = attributes["starts"], attributes["ends"]
        axes = attributes.get("axes", range(len(starts)))
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, stop, axis, step in zip(starts, ends, np.asarray(axes).reshape(-1), steps):
        if int(step) == 0:
            raise OperatorError("steps must not be 0")
        index[int(axis)] = slice(int(start), int(stop), int(step))
    return [x[tuple(index)]]


def _reshape(inputs, attributes):
    x, shape = inputs[0], [int(s) for s in np.asarray(inputs[1]).reshape(-1)]
    if not attributes.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    try:
        return [x.reshape(shape)]
    except ValueError as error:
        raise OperatorError(f"cannot reshape {x.shape} to {shape}: {error}") from None


def _flatten(inputs, attributes):
    x = inputs[0]
    axis = attributes.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [x.reshape(rows, -1) if x.size else x.reshape(rows, int(np.prod(x.shape[axis:])))]


def _transpose(inputs, attributes):
    perm = attributes.get("perm")
    return [np.transpose(inputs[0], perm)]


def _shape(inputs, attributes):
    shape = np.array(inputs[0].shape, dtype=np.int64)
    start, end = attributes.get("start", 0), attributes.get("end")
    return [shape[start:end]]


def _gather(inputs, attributes):
    return [
        np.take(inputs[0], np.asarray(inputs[1], dtype=np.int64), axis=attributes.get("axis", 0))
    ]


def _unsqueeze(inputs, attributes):
    x = inputs[0]
    axes = sorted(a + x.ndim + len(_axes(inputs, attributes)) if a < 0 else a
                  for a in _axes(inputs, attributes))  # fmt: skip
    for axis in axes:
        x = np.expand_dims(x, axis)
    return [x]


def _squeeze(inputs, attributes):
    axes = _axes(inputs, attributes)
    return [np.squeeze(inputs[0], axis=None if axes is None else tuple(axes))]


def _layer_normalization(inputs, attributes):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attributes.get("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    epsilon = attributes.get("epsilon", 1e-5)
    axes = tuple(range(axis, x.ndim))
    wide = x.astype(np.float64)
    mean = wide.mean(axis=axes, keepdims=True)
    inverse = 1.0 / np.sqrt(((wide - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon)
    y = (wide - mean) * inverse * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype), mean.astype(x.dtype), inverse.astype(x.dtype)]


def _softmax(inputs, attributes):
    x = inputs[0]
    axis = attributes.get("axis", -1)
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return [(shifted / shifted.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)]


def _batch_normalization(inputs, attributes):
    x, scale, bias, mean, variance = inputs[:5]
    epsilon = attributes.get("epsilon", 1e-5)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    factor = (scale / np.sqrt(variance + x.dtype.type(epsilon))).astype(x.dtype)
    shift = (bias - mean * factor).astype(x.dtype)
    return [x * factor.reshape(shape) + shift.reshape(shape)]


def _cast(inputs, attributes):
    from onnx import helper

    return [inputs[0].astype(helper.tensor_dtype_to_np_dtype(attributes["to"]))]


def _identity(inputs, attributes):
    return [inputs[0]]


def _dropout(inputs, attributes):
    # Inference: the input unchanged, and a mask of ones when asked for.
    return [inputs[0], np.ones(inputs[0].shape, dtype=bool)]


def _constant_of_shape(inputs, attributes):
    value = attributes.get("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    shape = [int(d) for d in np.asarray(inputs[0]).reshape(-1)]
    return [np.full(shape, fill[0], dtype=fill.dtype)]


def _expand(inputs, attributes):
    x, shape = inputs[0], [int(d) for d in np.asarray(inputs[1]).reshape(-1)]
    # ONNX broadcasts both ways: a 1 in ``shape`` keeps x's extent.
    target = np.broadcast_shapes(x.shape, tuple(shape))
    return [np.broadcast_to(x, target).copy()]


def _mod(inputs, attributes):
    a, b = inputs[0], inputs[1]
    if attributes.get("fmod", 0):
        return [np.fmod(a, b)]
    return [np.mod(a, b)]


def _pad(inputs, attributes):
    x = inputs[0]
    pads = [int(p) for p in np.asarray(inputs[1]).reshape(-1)]
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else 0
    axes = list(range(x.ndim))
    if len(inputs) > 3 and inputs[3] is not None:
        axes = [int(a) % x.ndim for a in np.asarray(inputs[3]).reshape(-1)]
    half = len(pads) // 2
    widths = [(0, 0)] * x.ndim
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + half])
    if any(b < 0 or e < 0 for b, e in widths):
        raise OperatorError("negative pads (cropping) are not supported")
    mode = attributes.get("mode", "constant")
    if mode == "constant":
        return [np.pad(x, widths, constant_values=np.asarray(value).reshape(-1)[0])]
    return [np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]


def _range(inputs, attributes):
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs[:3])
    return [np.arange(start, limit, delta, dtype=np.result_type(start, limit, delta))]


def _scatter_nd(inputs, attributes):
    data, indices, updates = inputs[0].copy(), np.asarray(inputs[1]), inputs[2]
    reduction = attributes.get("reduction", "none")
    if reduction != "none":
        raise OperatorError(f"reduction {reduction!r} is not supported")
    flat = indices.reshape(-1, indices.shape[-1])
    rows = updates.reshape((flat.shape[0],) + data.shape[indices.shape[-1] :])
    for index, row in zip(flat, rows):
        data[tuple(index)] = row
    return [data]


def _where(inputs, attributes):
    return [np.where(inputs[0], inputs[1], inputs[2])]


def _einsum(inputs, attributes):
    return [np.einsum(attributes["equation"], *inputs)]


OPERATORS = {
    "Relu": _unary(lambda x: np.maximum(x, x.dtype.type(0))),
    "Sigmoid": _unary(_sigmoid),
    "Tanh": _unary(np.tanh),
    "Exp": _unary(np.exp),
    "Sqrt": _unary(np.sqrt),
    "Neg": _unary(np.negative),
    "Erf": _unary(_erf),
    "Clip": _clip,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_divide),
    "Pow": _binary(lambda a, b: np.power(a, b).astype(a.dtype, copy=False)),
    "MatMul": _matmul,
    "Gemm": _gemm,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
    "ReduceMean": _reduce_mean,
    "Concat": _concat,
    "Slice": _slice,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Shape": _shape,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "LayerNormalization": _layer_normalization,
    "Softmax": _softmax,
    "BatchNormalization": _batch_normalization,
    "Cast": _cast,
    "Identity": _identity,
    "Dropout": _dropout,
    "ConstantOfShape": _constant_of_shape,
    "Equal": _binary(np.equal),
    "Not": _unary(np.logical_not),
    "Expand": _expand,
    "Mod": _mod,
    "Pad": _pad,
    "Range": _range,
    "ScatterND": _scatter_nd,
    "Where": _where,
    "Einsum": _einsum,
}
