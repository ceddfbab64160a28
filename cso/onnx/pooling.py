"""ONNX's pooling operators in NumPy: MaxPool, AveragePool, GlobalAveragePool.

Each is ``operator(inputs, attributes) -> list of outputs``, as in
:mod:`.operators`.  The window geometry (``auto_pad``, ``ceil_mode``,
dilations) is ONNX's; each kernel offset is one strided view of the padded
input, reduced with the others.
"""

from __future__ import annotations

import numpy as np

from .errors import OperatorError


def _pool_geometry(x, attributes, kernel):
    """``(pads_begin, pads_end, strides, dilations, output sizes, extra end
    padding)`` of a pooling over ``x``'s spatial axes (ONNX's pooling rules,
    ``auto_pad`` and ``ceil_mode`` included)."""
    spatial = x.shape[2:]
    rank = len(spatial)
    strides = list(attributes.get("strides", [1] * rank))
    dilations = list(attributes.get("dilations", [1] * rank))
    pads = list(attributes.get("pads", [0] * (2 * rank)))
    auto_pad = attributes.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if len(kernel) != rank or len(strides) != rank or len(pads) != 2 * rank:
        raise OperatorError(
            f"kernel_shape, strides and pads must have {rank}, {rank} and {2 * rank} entries "
            f"for a {x.ndim}-D input, got {kernel}, {strides}, {pads}"
        )
    begin, end = pads[:rank], pads[rank:]
    ceil = bool(attributes.get("ceil_mode", 0))
    outputs = []
    for axis in range(rank):
        extent = dilations[axis] * (kernel[axis] - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-spatial[axis] // strides[axis])
            total = max(0, (out - 1) * strides[axis] + extent - spatial[axis])
            small, large = total // 2, total - total // 2
            begin[axis], end[axis] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            begin[axis] = end[axis] = 0
        span = spatial[axis] + begin[axis] + end[axis] - extent
        if span < 0:
            raise OperatorError(
                f"the pooling window ({extent}) is larger than the padded input along axis "
                f"{axis + 2} ({spatial[axis] + begin[axis] + end[axis]})"
            )
        out = (-(-span // strides[axis]) if ceil else span // strides[axis]) + 1
        if ceil and (out - 1) * strides[axis] >= spatial[axis] + begin[axis]:
            out -= 1  # the last window must start inside the input or its left padding
        outputs.append(out)
    extra = [
        max(0, (outputs[a] - 1) * strides[a] + dilations[a] * (kernel[a] - 1) + 1
            - (spatial[a] + begin[a] + end[a]))
        for a in range(rank)
    ]  # fmt: skip
    return begin, end, strides, dilations, outputs, extra


def _pool_windows(padded, kernel, strides, dilations, outputs):
    """Yield, for every kernel offset, the strided view of ``padded`` it reads."""
    for offset in np.ndindex(*kernel):
        index = [slice(None), slice(None)]
        for axis, k in enumerate(offset):
            start = k * dilations[axis]
            stop = start + (outputs[axis] - 1) * strides[axis] + 1
            index.append(slice(start, stop, strides[axis]))
        yield padded[tuple(index)]


def max_pool(inputs, attributes):
    x = inputs[0]
    kernel = list(attributes["kernel_shape"])
    begin, end, strides, dilations, outputs, extra = _pool_geometry(x, attributes, kernel)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    widths = [(0, 0), (0, 0)] + [(b, e + x_) for b, e, x_ in zip(begin, end, extra)]
    padded = np.pad(x, widths, constant_values=lowest)
    result = None
    for view in _pool_windows(padded, kernel, strides, dilations, outputs):
        result = view.copy() if result is None else np.maximum(result, view, out=result)
    return [result]


def average_pool(inputs, attributes):
    x = inputs[0]
    kernel = list(attributes["kernel_shape"])
    begin, end, strides, dilations, outputs, extra = _pool_geometry(x, attributes, kernel)
    widths = [(0, 0), (0, 0)] + [(b, e + x_) for b, e, x_ in zip(begin, end, extra)]
    padded = np.pad(x, widths)
    # What each window divides by: the input's elements, and the explicit
    # padding's when count_include_pad (never the ceil_mode extension).
    counted = np.pad(np.ones((1, 1) + x.shape[2:], x.dtype), widths)
    if attributes.get("count_include_pad", 0):
        counted = np.pad(
            np.ones((1, 1) + tuple(s + b + e for s, b, e in zip(x.shape[2:], begin, end)), x.dtype),
            [(0, 0), (0, 0)] + [(0, e) for e in extra],
        )
    total = np.zeros(x.shape[:2] + tuple(outputs), x.dtype)
    count = np.zeros((1, 1) + tuple(outputs), x.dtype)
    for view, ones in zip(
        _pool_windows(padded, kernel, strides, dilations, outputs),
        _pool_windows(counted, kernel, strides, dilations, outputs),
    ):
        total += view
        count += ones
    return [(total / count).astype(x.dtype, copy=False)]


def global_average_pool(inputs, attributes):
    x = inputs[0]
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)]
