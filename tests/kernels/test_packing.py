"""Packing routines against the layouts their contracts state."""

import numba
import numpy as np
import pytest

from cso.packing.filters import pack_bias, pack_edge_filters, pack_filters_panels
from cso.packing.inputs import pack_input_panel_gather, pack_input_panel_shifted, pad_input
from cso.packing.vector_copy import copy_run, gather_run


@numba.njit
def _copy(dst, dst_offset, src, src_offset, count):
    copy_run(dst, dst_offset, src, src_offset, count)


@numba.njit
def _gather(dst, dst_offset, src, src_offset, count, stride):
    gather_run(dst, dst_offset, src, src_offset, count, stride)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_copies_touch_exactly_their_run(dtype):
    source = np.arange(300, dtype=dtype)
    for count in range(0, 40):
        for stride in (1, 2, 3):
            target = np.full(64, -1, dtype)
            _gather(target, 3, source, 5, count, stride)
            expected = np.full(64, -1, dtype)
            expected[3:3 + count] = source[5:5 + stride * count:stride]
            assert np.array_equal(target, expected)
        target = np.full(64, -1, dtype)
        _copy(target, 7, source, 2, count)
        expected = np.full(64, -1, dtype)
        expected[7:7 + count] = source[2:2 + count]
        assert np.array_equal(target, expected)


def _expected_panel(x_padded, image, c0, nc, R, S, sh, sw, dh, dw, P, Q, w0, nwin):
    panel = np.zeros((nc, R, S, nwin), x_padded.dtype)
    for j in range(nwin):
        window = w0 + j
        if window >= P * Q:
            continue
        p, q = divmod(window, Q)
        for r in range(R):
            for s in range(S):
                panel[:, r, s, j] = x_padded[image, c0:c0 + nc, p * sh + r * dh, q * sw + s * dw]
    return panel.reshape(-1)


@pytest.mark.parametrize("stride, dilation, padding", [
    ((1, 1), (1, 1), (1, 1, 1, 1)), ((1, 1), (2, 1), (0, 2, 1, 0)),
    ((2, 2), (1, 1), (3, 3, 3, 3)), ((3, 1), (1, 2), (0, 0, 2, 1))])
def test_input_panels(stride, dilation, padding):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 11, 13)).astype(np.float32)
    x_padded = pad_input(x, *padding, np.float32)
    R, S = 3, 2
    Hp, Wp = x_padded.shape[2:]
    P = (Hp - dilation[0] * (R - 1) - 1) // stride[0] + 1
    Q = (Wp - dilation[1] * (S - 1) - 1) // stride[1] + 1
    nwin = 32
    flat = x_padded.reshape(-1)
    for image, c0, nc in ((0, 0, 5), (1, 1, 3)):
        offset = image * 5 * Hp * Wp
        for w0 in range(0, P * Q, nwin):
            panel = np.full(7 + nc * R * S * nwin, np.nan, np.float32)
            if stride == (1, 1):
                pack_input_panel_shifted(flat, offset, Hp, Wp, c0, nc, R, S, dilation[0],
                                         dilation[1], Q, P * Q, w0, nwin, panel, 7)
            else:
                pack_input_panel_gather(flat, offset, Hp, Wp, c0, nc, R, S, stride[0], stride[1],
                                        dilation[0], dilation[1], Q, P * Q, w0, nwin, panel, 7)
            expected = _expected_panel(x_padded, image, c0, nc, R, S, *stride, *dilation, P, Q,
                                       w0, nwin)
            assert np.array_equal(panel[7:], expected)
            assert np.isnan(panel[:7]).all()


def test_pad_input_zero_borders():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float64).reshape(2, 3, 4, 5)
    padded = pad_input(x, 1, 2, 0, 3, np.float32)
    assert padded.dtype == np.float32 and padded.shape == (2, 3, 7, 8)
    assert np.array_equal(padded[:, :, 1:5, 0:5], x.astype(np.float32))
    assert padded.sum() == x.sum()
    assert pad_input(x, 0, 0, 0, 0, np.float64) is x


def test_filter_panels_layout():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((10, 3, 2, 2))  # two groups of K_g = 5
    packed = pack_filters_panels(w, 2, 4, np.float64).reshape(2, 2, 12, 4)
    for g in range(2):
        for k in range(5):
            tile, i = divmod(k, 4)
            assert np.array_equal(packed[g, tile, :, i], w[g * 5 + k].reshape(-1))
        assert not packed[g, 1, :, 1:].any()  # rows past K_g are zero


def test_edge_filters_are_the_packed_last_tile():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((10, 3, 2, 2))
    edges = pack_edge_filters(w.reshape(-1), 2, 5, 12, 4).reshape(2, 12, 4)
    full = pack_filters_panels(w, 2, 4, np.float64).reshape(2, 2, 12, 4)
    assert np.array_equal(edges, full[:, 1])
    assert pack_edge_filters(w.reshape(-1), 2, 5, 12, 5).size == 5  # no edge tile


def test_bias_packing():
    packed = pack_bias(np.arange(1, 7), 6, 2, 2, np.float32).reshape(2, 4)
    assert np.array_equal(packed, [[1, 2, 3, 0], [4, 5, 6, 0]])
    assert not pack_bias(None, 6, 2, 2, np.float32).any()
