"""The Winograd transforms' generated kernels against NumPy's matrices:
a vector of tiles at every offset, edge and mask the nest gives them."""

import numpy as np
import pytest
from conftest import WINOGRAD_A_T, WINOGRAD_B_T, WINOGRAD_G
from numba import njit

from cso.microkernels.winograd_transforms import (
    build_filter_tiles,
    build_input_tiles,
    build_output_tiles,
)

DTYPES = [(np.float32, 16), (np.float64, 8)]


@pytest.mark.parametrize("dtype, lanes", DTYPES)
@pytest.mark.parametrize("first_column", [-2, -1, 0, 3])
@pytest.mark.parametrize("valid", [0b1111, 0b0110, 0b1000, 0])
def test_input_tiles(dtype, lanes, first_column, valid):
    kernel = build_input_tiles(np.dtype(dtype).name, lanes)

    @njit
    def run(x, row_offset, valid, first_column, width, v, v_offset, stride):
        kernel(x, row_offset, valid, first_column, width, v, v_offset, stride)

    rng = np.random.default_rng(first_column + 2 + 7 * valid)
    width = 2 * lanes - 3
    x = rng.standard_normal(8 * width).astype(dtype)
    stride = 3 * lanes + 1
    v = np.full(16 * stride + lanes, np.nan, dtype)
    row_offset = 2 * width
    run(x, row_offset, valid, first_column, width, v, 1, stride)
    rows = x[row_offset : row_offset + 4 * width].reshape(4, width).astype(np.float64)
    for t in range(lanes):
        d = np.zeros((4, 4))
        for a in range(4):
            for j in range(4):
                q = first_column + 2 * t + j
                if valid >> a & 1 and 0 <= q < width:
                    d[a, j] = rows[a, q]
        expected = WINOGRAD_B_T @ d @ WINOGRAD_B_T.T
        got = v[1 + t : 1 + t + 16 * stride : stride]
        np.testing.assert_allclose(got, expected.reshape(16), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype, lanes", DTYPES)
@pytest.mark.parametrize("columns, two_rows", [(None, True), (5, True), (1, False), (None, False)])
@pytest.mark.parametrize("activation, has_residual", [(0, False), (1, True)])
def test_output_tiles(dtype, lanes, columns, two_rows, activation, has_residual):
    kernel = build_output_tiles(np.dtype(dtype).name, lanes)

    @njit
    def run(m, m_offset, stride, y, y_offset, row_stride, columns, two_rows, bias, residual,
            activation, has_residual):  # fmt: skip
        kernel(m, m_offset, stride, y, y_offset, row_stride, columns, two_rows, bias, residual,
               activation, has_residual)  # fmt: skip

    columns = 2 * lanes if columns is None else columns
    rng = np.random.default_rng(columns)
    stride = 2 * lanes + 3
    m = rng.standard_normal(16 * stride + 2).astype(dtype)
    row_stride = 2 * lanes + 5
    y = np.full(3 * row_stride, -7.0, dtype)
    residual = rng.standard_normal(y.size).astype(dtype)
    bias = dtype(0.25)
    run(m, 2, stride, y, 1, row_stride, columns, two_rows, bias, residual, activation,
        has_residual)  # fmt: skip
    expected = np.full(y.size, -7.0)
    for t in range(lanes):
        tile = m[2 + t : 2 + t + 16 * stride : stride].astype(np.float64).reshape(4, 4)
        out = WINOGRAD_A_T @ tile @ WINOGRAD_A_T.T + 0.25
        for r in range(2 if two_rows else 1):
            for c in range(2):
                q = 2 * t + c
                if q < columns:
                    at = 1 + r * row_stride + q
                    value = out[r, c] + (residual[at] if has_residual else 0.0)
                    expected[at] = max(value, 0.0) if activation == 1 else value
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype, lanes", DTYPES)
@pytest.mark.parametrize("count", [1, 5, None])
def test_filter_tiles(dtype, lanes, count):
    kernel = build_filter_tiles(np.dtype(dtype).name, lanes)

    @njit
    def run(w, w_offset, count, u, u_offset, stride):
        kernel(w, w_offset, count, u, u_offset, stride)

    count = lanes if count is None else count
    rng = np.random.default_rng(count)
    w = rng.standard_normal(9 * (lanes + 2)).astype(dtype)
    stride = lanes + 3
    u = np.full(16 * stride + 4, np.nan, dtype)
    run(w, 9, count, u, 2, stride)
    for i in range(lanes):
        got = u[2 + i : 2 + i + 16 * stride : stride]
        if i < count:
            g = w[9 + 9 * i : 18 + 9 * i].astype(np.float64).reshape(3, 3)
            expected = (WINOGRAD_G @ g @ WINOGRAD_G.T).reshape(16)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        else:
            assert np.all(np.isnan(got)), "a filter past count was written"
