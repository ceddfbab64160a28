"""Independent float64 references: im2col + GEMM, and a naive loop for tiny cases.

Neither shares code with the compiled path beyond parameter validation, so a
test comparing ``cso.conv2d`` with them compares two independent programs.
"""

from __future__ import annotations

import numpy as np

from .geometry import make_geometry


def conv2d(
    x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, dtype=np.float64
) -> np.ndarray:
    """im2col + GEMM (NumPy matmul); same parameters as :func:`cso.conv2d`.

    ``dtype`` is the precision of the whole computation: float64 for the
    reference, float32 for the im2col + BLAS peer of the benchmark.

    Returns
    -------
    numpy.ndarray
        Of ``dtype``, shape ``(N, K, P, Q)``.
    """
    x = np.asarray(x, dtype=dtype)
    w = np.asarray(w, dtype=dtype)
    g = make_geometry(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    padded = np.pad(x, ((0, 0), (0, 0), (g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right)))
    P, Q = g.out_height, g.out_width
    columns = np.empty((g.batch, g.channels, g.kernel_height, g.kernel_width, P, Q), dtype)
    for r in range(g.kernel_height):
        for s in range(g.kernel_width):
            top, left = r * g.dilation_h, s * g.dilation_w
            columns[:, :, r, s] = padded[
                :,
                :,
                top : top + g.stride_h * (P - 1) + 1 : g.stride_h,
                left : left + g.stride_w * (Q - 1) + 1 : g.stride_w,
            ]
    columns = columns.reshape(g.batch, g.groups, g.reduction_length, P * Q)
    weights = w.reshape(1, g.groups, g.filters_per_group, g.reduction_length)
    y = np.matmul(weights, columns).reshape(g.batch, g.filters, P, Q)
    if bias is not None:
        y += np.asarray(bias, dtype=dtype).reshape(1, -1, 1, 1)
    return y


def naive_conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    """The definition, one output element at a time (slow: for tiny shapes only)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    g = make_geometry(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    y = np.zeros(g.output_shape)
    cg, kg = g.channels_per_group, g.filters_per_group
    for n in range(g.batch):
        for k in range(g.filters):
            group = k // kg
            for p in range(g.out_height):
                for q in range(g.out_width):
                    total = 0.0 if bias is None else float(bias[k])
                    for c in range(cg):
                        for r in range(g.kernel_height):
                            for s in range(g.kernel_width):
                                h = p * g.stride_h + r * g.dilation_h - g.pad_top
                                v = q * g.stride_w + s * g.dilation_w - g.pad_left
                                if 0 <= h < g.height and 0 <= v < g.width:
                                    total += x[n, group * cg + c, h, v] * w[k, c, r, s]
                    y[n, k, p, q] = total
    return y
