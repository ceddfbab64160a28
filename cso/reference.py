"""Independent float64 references: im2col + GEMM, and a naive loop for tiny cases;
Winograd F(2x2, 3x3) in NumPy, and the bound its rounding errors obey.

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


# Winograd F(2x2, 3x3)'s matrices (Lavin and Gray, 2016), as the reference
# writes them down on its own (cso.microkernels.winograd_transforms emits them).
WINOGRAD_B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)
WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
WINOGRAD_A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)
# The most roundings on any path from an input to an output besides the
# channel sum's C - 1: the filter transform's four additions and two
# halvings, the input transform's two additions, the product, the output
# transform's four additions and the bias, and one rounding of each input
# to the dtype.
WINOGRAD_ROUNDINGS = 6 + 2 + 1 + 4 + 1 + 2


def winograd_float64(x, w, absolute=False, **params) -> np.ndarray:
    """F(2x2, 3x3) in float64 with NumPy, ``A^T (sum_c G g G^T * B^T d B) A``
    for each 2x2 output tile (``absolute``: every matrix taken absolute);
    ``x``, ``w`` and ``params`` as for :func:`conv2d`, one group, 3x3 filters,
    stride and dilation 1.  Equal to :func:`conv2d` up to rounding."""
    g = make_geometry(np.shape(x), np.shape(w), **params)
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    th, tw = -(-g.out_height // 2), -(-g.out_width // 2)
    padded = np.zeros((g.batch, g.channels, 2 * th + 2, 2 * tw + 2))
    rows = min(g.height, padded.shape[2] - g.pad_top)
    cols = min(g.width, padded.shape[3] - g.pad_left)
    inside = (slice(None), slice(None), slice(g.pad_top, g.pad_top + rows))
    padded[inside + (slice(g.pad_left, g.pad_left + cols),)] = x[:, :, :rows, :cols]
    # Input tiles d[n, c, ty, tx, 4, 4] at stride 2.
    windows = np.lib.stride_tricks.sliding_window_view(padded, (4, 4), axis=(2, 3))[:, :, ::2, ::2]
    b_t, gm, a_t = WINOGRAD_B_T, WINOGRAD_G, WINOGRAD_A_T
    if absolute:
        b_t, gm, a_t = np.abs(b_t), np.abs(gm), np.abs(a_t)
    v = np.einsum("ij,ncyxjk,lk->ncyxil", b_t, windows, b_t)
    u = np.einsum("ij,kcjl,ml->kcim", gm, w, gm)
    m = np.einsum("kcil,ncyxil->nkyxil", u, v)
    y = np.einsum("ij,nkyxjl,ml->nkyxim", a_t, m, a_t)
    y = y.transpose(0, 1, 2, 4, 3, 5).reshape(g.batch, g.filters, 2 * th, 2 * tw)
    return y[:, :, : g.out_height, : g.out_width]


def winograd_magnitude(x, w, **params) -> np.ndarray:
    """``|A^T| (sum_c |G||g||G^T| * |B^T||d||B|) |A|``: the Winograd
    computation with every coefficient and operand taken absolute, per
    output, what its rounding errors are bounded by."""
    return winograd_float64(np.abs(x), np.abs(w), absolute=True, **params)


def winograd_error_bound(x, w, bias, dtype, **params) -> np.ndarray:
    """Elementwise bound on ``|computed - exact|`` for F(2x2, 3x3) in
    ``dtype``: ``gamma_n * winograd_magnitude`` (forward error analysis of
    the transforms, products and channel sums: ``n = C +
    WINOGRAD_ROUNDINGS``, the longest path's roundings, ``gamma_n = n u /
    (1 - n u)``), the bias's magnitude added, plus the smallest normal
    number for underflow."""
    g = make_geometry(np.shape(x), np.shape(w), **params)
    magnitude = winograd_magnitude(x, w, **params)
    if bias is not None:
        magnitude = magnitude + np.abs(np.asarray(bias, np.float64)).reshape(1, -1, 1, 1)
    u = np.finfo(dtype).eps / 2
    n = g.channels + WINOGRAD_ROUNDINGS
    return n * u / (1 - n * u) * magnitude + np.finfo(dtype).tiny
