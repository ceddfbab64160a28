"""Packing routines against the layouts their contracts state."""

import numba
import numpy as np
import pytest

from cso.packing.filters import pack_bias, pack_edge_filters, pack_filters_panels
from cso.packing.inputs import POINTWISE_CHUNK, pack_input_panel, pack_pointwise_panels
from cso.packing.transpose import transpose_block, vector_token
from cso.packing.run_stores import copy_run
from cso.packing.vector_copy import pack_row_runs


def _jitted(intrinsic):
    """A jitted pass-through: the packing intrinsics are callable only from jitted code."""

    @numba.njit
    def run(*args):
        intrinsic(*args)

    return run


# The vector widths of SSE/NEON, AVX2 and AVX-512 in float32: the packing
# takes its width from the plan, and must give the same panels at each.
WIDTHS = [4, 8, 16]
V16 = vector_token(16)

_copy = _jitted(copy_run)
_pack_rows = _jitted(pack_row_runs)
_transpose = _jitted(transpose_block)


@pytest.mark.parametrize("lanes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_copy_run_touches_exactly_its_run(dtype, lanes):
    source = np.arange(100, dtype=dtype)
    for count in range(0, 40):
        target = np.full(64, -1, dtype)
        _copy(target, 7, source, 2, count, vector_token(lanes))
        expected = np.full(64, -1, dtype)
        expected[7 : 7 + count] = source[2 : 2 + count]
        assert np.array_equal(target, expected)


@pytest.mark.parametrize("lanes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_pack_row_runs_against_the_definition(dtype, step, lanes):
    width = 23
    row = np.arange(1, width + 1, dtype=dtype)
    source = np.concatenate([np.full(9, np.nan, dtype), row, np.full(9, np.nan, dtype)])
    for first_column in (-4, 0, 5):
        for shift, copies in ((1, 3), (2, 2)):
            # count == room up to 15: every partial vector's lane count, each
            # stored in its own plain pieces, at every width.
            exact = tuple((count, count) for count in range(16))
            for count, room in exact + ((16, 16), (17, 17), (33, 33),
                                        (1, 5), (7, 16), (17, 20), (17, 40)):  # fmt: skip
                stride = 40
                target = np.full(copies * stride + 3, -1, dtype)
                _pack_rows(
                    target,
                    2,
                    stride,
                    source,
                    9,
                    first_column,
                    step,
                    shift,
                    copies,
                    count,
                    room,
                    0,
                    width,
                    1,
                    0,
                    0,
                    vector_token(lanes),
                )
                expected = np.full_like(target, -1)
                for s in range(copies):
                    for t in range(count):
                        column = first_column + s * shift + t * step
                        expected[2 + s * stride + t] = row[column] if 0 <= column < width else 0
                    # Past the run, within the room, whatever the last vector
                    # loaded may be stored; never NaN (read outside the row).
                    tail = slice(2 + s * stride + count, 2 + s * stride + room)
                    assert not np.isnan(target[tail]).any()
                    expected[tail] = target[tail]
                assert np.array_equal(target, expected)  # NaN outside the row is never read
    zeroed = np.full(10, -1, dtype)
    # A row in the padding.
    _pack_rows(zeroed, 0, 5, source, 0, 0, step, 1, 2, 4, 4, 0, 0, 1, 0, 0, vector_token(lanes))
    assert np.array_equal(zeroed, [0, 0, 0, 0, -1] * 2)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_a_runs_last_vector_is_stored_whole_only_within_its_room(step):
    # Masked stores are microcoded on AMD: within the room the last, partial
    # vector is a plain store (lanes past the run written), past it plain
    # pieces of the run's lanes only.
    source = np.arange(1, 40, dtype=np.float32)
    for room, written in ((5, 5), (7, 5), (8, 8), (20, 8)):
        target = np.full(24, -1, np.float32)
        _pack_rows(
            target, 0, 12, source, 0, 0, step, 1, 1, 5, room, 0, 39, 1, 0, 0, vector_token(8)
        )
        assert np.array_equal(target[:5], source[: 5 * step : step])
        assert (target[5:written] != -1).all() and (target[written:] == -1).all()


@pytest.mark.parametrize("step", [1, 2])
def test_room_step_lets_a_copy_run_into_the_rows_after_it(step):
    # Rows of 5, 8 lanes: copy s may store whole into the rows of the copies
    # after it (room + (copies - 1 - s) * room_step), the last keeps to room.
    source = np.arange(1, 60, dtype=np.float32)
    copies, stride = 3, 5
    target = np.full(copies * stride + 8, -1, np.float32)
    _pack_rows(
        target, 0, stride, source, 0, 0, step, 1, copies, 5, 5, stride, 59, 1, 0, 0,
        vector_token(8),
    )  # fmt: skip
    for s in range(copies):
        assert np.array_equal(target[s * stride : s * stride + 5], source[s : s + 5 * step : step])
    # The last copy's vector did not fit its room of 5: stored in pieces, nothing past it.
    assert (target[copies * stride :] == -1).all()


@pytest.mark.parametrize("step", [1, 2, 3])
def test_pack_row_runs_over_channels(step):
    width, plane, channels = 19, 40, 3
    source = np.full(channels * plane + 20, np.nan, np.float32)
    for c in range(channels):
        source[c * plane + 5 : c * plane + 5 + width] = np.arange(width) + 100 * c
    stride, channel_stride = 24, 60
    target = np.full(channels * channel_stride, -1, np.float32)
    _pack_rows(
        target, 1, stride, source, 5, -2, step, 1, 2, 17, 17, 0, width, channels, channel_stride,
        plane, V16,
    )  # fmt: skip
    expected = np.full_like(target, -1)
    for c in range(channels):
        for s in range(2):
            for t in range(17):
                column = -2 + s + t * step
                value = column + 100 * c if 0 <= column < width else 0
                expected[c * channel_stride + 1 + s * stride + t] = value
    assert np.array_equal(target, expected)


def _expected_panel(x, image, c0, nc, R, S, sh, sw, dh, dw, padding, P, Q, w0, nwin):
    top, bottom, left, right = padding
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    panel = np.zeros((nc, R, S, nwin), x.dtype)
    for j in range(nwin):
        window = w0 + j
        if window >= P * Q:
            continue
        p, q = divmod(window, Q)
        for r in range(R):
            for s in range(S):
                panel[:, r, s, j] = padded[image, c0 : c0 + nc, p * sh + r * dh, q * sw + s * dw]
    return panel.reshape(-1)


@pytest.mark.parametrize(
    "stride, dilation, padding",
    [
        ((1, 1), (1, 1), (1, 1, 1, 1)),
        ((1, 1), (2, 1), (0, 2, 1, 0)),
        ((2, 2), (1, 1), (3, 3, 3, 3)),
        ((3, 1), (1, 2), (0, 0, 2, 1)),
        ((1, 2), (1, 1), (5, 5, 6, 6)),
    ],
)
def test_input_panels(stride, dilation, padding):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 11, 13)).astype(np.float32)
    top, bottom, left, right = padding
    R, S = 3, 2
    P = (11 + top + bottom - dilation[0] * (R - 1) - 1) // stride[0] + 1
    Q = (13 + left + right - dilation[1] * (S - 1) - 1) // stride[1] + 1
    nwin = 32
    flat = x.reshape(-1)
    for image, c0, nc in ((0, 0, 5), (1, 1, 3)):
        for w0 in range(0, P * Q, nwin):
            panel = np.full(7 + nc * R * S * nwin, np.nan, np.float32)
            pack_input_panel(
                flat,
                image * 5 * 11 * 13,
                11,
                13,
                top,
                left,
                c0,
                nc,
                R,
                S,
                *stride,
                *dilation,
                Q,
                P * Q,
                w0,
                nwin,
                panel,
                7,
                P * Q,
                5 * 11 * 13,
                V16,
            )
            expected = _expected_panel(
                x, image, c0, nc, R, S, *stride, *dilation, padding, P, Q, w0, nwin
            )
            assert np.array_equal(panel[7:], expected)
            assert np.isnan(panel[:7]).all()


@pytest.mark.parametrize("lanes", WIDTHS)
@pytest.mark.parametrize("kernel", [(3, 3), (1, 3), (3, 1), (2, 2), (1, 1)])
@pytest.mark.parametrize(
    "nwin, tiles_per_row, stride", [(7, 1, 1), (14, 2, 1), (5, 3, 2), (3, 1, 1)]
)
def test_input_panels_of_whole_row_tiles(lanes, kernel, nwin, tiles_per_row, stride):
    # Each tile one whole output row: its rows' last vectors are stored
    # whole into the rows packed after them (room_step), never past the
    # channel's last row or the panel's end.
    R, S = kernel
    Q = nwin * tiles_per_row
    P, C = 4, 3
    H, W = (P - 1) * stride + R - 2, (Q - 1) * stride + S - 2  # padding 1 on every side
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, C, H, W)).astype(np.float32)
    for w0 in range(0, P * Q, nwin):
        panel = np.full(6 + C * R * S * nwin + 40, np.nan, np.float32)
        pack_input_panel(
            x.reshape(-1), 0, H, W, 1, 1, 0, C, R, S, stride, stride, 1, 1, Q, P * Q, w0,
            nwin, panel, 6, P * Q, C * H * W, vector_token(lanes),
        )  # fmt: skip
        padding = (1, 1, 1, 1)
        expected = _expected_panel(x, 0, 0, C, R, S, stride, stride, 1, 1, padding, P, Q, w0, nwin)
        assert np.array_equal(panel[6 : 6 + expected.size], expected)
        assert np.isnan(panel[:6]).all() and np.isnan(panel[6 + expected.size :]).all()


def test_input_panels_across_images():
    """With the batch folded into the windows, a panel's columns run on from
    one image's last window into the next image's first, and are zero past
    the last image's."""
    rng = np.random.default_rng(2)
    images, C, H, W = 3, 4, 5, 6
    x = rng.standard_normal((images, C, H, W)).astype(np.float32)
    R, S, padding = 3, 3, (1, 1, 1, 1)
    P, Q, nwin, c0, nc = H, W, 16, 1, 3
    for w0 in range(0, images * P * Q, nwin):
        panel = np.full(nc * R * S * nwin + 5, np.nan, np.float32)
        pack_input_panel(
            x.reshape(-1), 0, H, W, 1, 1, c0, nc, R, S, 1, 1, 1, 1, Q, images * P * Q, w0,
            nwin, panel, 5, P * Q, C * H * W, V16,
        )  # fmt: skip
        expected = np.zeros((nc * R * S, nwin), np.float32)
        for j in range(nwin):
            image, local = divmod(w0 + j, P * Q)
            if image < images:
                args = (x, image, c0, nc, R, S, 1, 1, 1, 1, padding, P, Q, local, 1)
                expected[:, j] = _expected_panel(*args)
        assert np.array_equal(panel[5:], expected.reshape(-1))
        assert np.isnan(panel[:5]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pointwise_panels_are_the_tiles_panels(dtype):
    # A 1x1 block packed channel by channel: each tile's panel as
    # pack_input_panel makes it, across chunk boundaries and past P*Q.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 23, 29)).astype(dtype)
    plane, nwin = 23 * 29, 16
    window_tiles = -(-plane // nwin)
    flat = x.reshape(-1)
    for image, c0, nc in ((0, 0, 6), (1, 2, 3)):
        for first, tiles in ((0, 1), (3, POINTWISE_CHUNK + 1), (window_tiles - 5, 5)):
            size = nc * nwin
            panels = np.full(tiles * size + 13, np.nan, dtype)
            pack_pointwise_panels(
                flat,
                (image * 6 + c0) * plane,
                plane,
                nc,
                first * nwin,
                tiles,
                nwin,
                panels,
                4,
                size,
                V16,
            )
            for t in range(tiles):
                expected = _expected_panel(
                    x,
                    image,
                    c0,
                    nc,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    (0, 0, 0, 0),
                    23,
                    29,
                    (first + t) * nwin,
                    nwin,
                )
                assert np.array_equal(panels[4 + t * size : 4 + (t + 1) * size], expected)
            assert np.isnan(panels[:4]).all() and np.isnan(panels[4 + tiles * size :]).all()


def test_filter_panels_layout():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((10, 3, 2, 2))  # two groups of K_g = 5
    packed = pack_filters_panels(w, 2, 4, np.float64, 8).reshape(2, 2, 12, 4)
    for g in range(2):
        for k in range(5):
            tile, i = divmod(k, 4)
            assert np.array_equal(packed[g, tile, :, i], w[g * 5 + k].reshape(-1))
        assert not packed[g, 1, :, 1:].any()  # rows past K_g are zero


@pytest.mark.parametrize("lanes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transpose_block_writes_exactly_its_block(dtype, lanes):
    rng = np.random.default_rng(3)
    source = rng.standard_normal((lanes + 3) * 40).astype(dtype)
    blocks = [(lanes, lanes, lanes), (0, lanes, lanes), (3, min(5, lanes), lanes - 1), (1, 1, 1)]
    for rows, columns, width in blocks:
        target = np.full(40 * lanes, np.nan, dtype)
        _transpose(target, 5, 40, source, 2, lanes + 3, rows, columns, width, vector_token(lanes))
        expected = np.full(40 * lanes, np.nan, dtype)
        block = source[2:].reshape(-1)[: rows * (lanes + 3)].reshape(rows, lanes + 3)[:, :columns]
        for j in range(columns):
            expected[5 + j * 40 : 5 + j * 40 + width] = 0
            expected[5 + j * 40 : 5 + j * 40 + rows] = block[:, j]
        np.testing.assert_array_equal(target, expected)


@pytest.mark.parametrize("lanes", WIDTHS)
@pytest.mark.parametrize("filters_per_tile", [8, 14, 32, 48])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_filter_panels_of_kernel_sized_tiles(filters_per_tile, dtype, lanes):
    # Reductions and tiles that are not multiples of the vector blocks.
    rng = np.random.default_rng(4)
    w = rng.standard_normal((2 * 37, 3, 7, 7)).astype(dtype)  # two groups, K_g = 37
    tiles = -(-37 // filters_per_tile)
    packed = pack_filters_panels(w, 2, filters_per_tile, dtype, lanes)
    panels = packed.reshape(2, tiles, 147, filters_per_tile)
    expected = np.zeros((2, tiles * filters_per_tile, 147), dtype)
    expected[:, :37] = w.reshape(2, 37, 147)
    expected = expected.reshape(2, tiles, filters_per_tile, 147).transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(panels, expected)


def test_edge_filters_are_the_packed_last_tile():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((10, 3, 2, 2))
    edges = pack_edge_filters(w.reshape(-1), 2, 5, 12, 4).reshape(2, 12, 4)
    full = pack_filters_panels(w, 2, 4, np.float64, 8).reshape(2, 2, 12, 4)
    assert np.array_equal(edges, full[:, 1])
    assert pack_edge_filters(w.reshape(-1), 2, 5, 12, 5).size == 5  # no edge tile


def test_bias_packing():
    packed = pack_bias(np.arange(1, 7), 6, 2, 2, np.float32).reshape(2, 4)
    assert np.array_equal(packed, [[1, 2, 3, 0], [4, 5, 6, 0]])
    assert not pack_bias(None, 6, 2, 2, np.float32).any()


@pytest.mark.parametrize(
    "height, width, pad_top, pad_left, rows, phase_width",
    [
        (14, 14, 1, 1, 16, 32),  # a 3x3 layer's channel
        (7, 7, 2, 2, 11, 16),  # 5x5 on a 7x7 plane
        (9, 20, 0, 3, 7, 32),  # rows past the last one the kernel reads are not packed
        (5, 16, 3, 0, 9, 16),  # a row exactly one vector wide
    ],
)
def test_stride_one_channel_rows_are_the_phases_inside(
    height, width, pad_top, pad_left, rows, phase_width
):
    # The tap nest zeroes a worker's channel once a call and packs only the
    # input rows at stride 1: what it then holds is the whole packed channel.
    from cso.packing.depthwise import pack_channel_phases, pack_channel_rows

    rng = np.random.default_rng(0)
    x = rng.standard_normal(3 * height * width).astype(np.float32)
    offset = height * width  # the middle of three planes
    whole = np.full(rows * phase_width + 5, np.nan, np.float32)
    pack_channel_phases(
        x, offset, height, width, pad_top, pad_left, 1, rows, phase_width, whole, 2,
        vector_token(16),
    )  # fmt: skip
    inside = np.zeros_like(whole)
    inside[:2] = inside[-3:] = np.nan
    pack_channel_rows(
        x, offset, height, width, pad_top, pad_left, rows, phase_width, inside, 2,
        vector_token(16),
    )  # fmt: skip
    assert np.array_equal(inside, whole, equal_nan=True)


@pytest.mark.parametrize("lanes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_whole_block_transpose_is_the_masked_one_of_a_whole_block(dtype, lanes):
    from cso.packing.transpose import transpose_whole_block

    whole = _jitted(transpose_whole_block)
    rng = np.random.default_rng(lanes)
    source = rng.standard_normal(3 * lanes * 40).astype(dtype)
    masked, plain = np.full(lanes * 50, -1, dtype), np.full(lanes * 50, -1, dtype)
    _transpose(masked, 3, 2 * lanes, source, 5, 40, lanes, lanes, lanes, vector_token(lanes))
    whole(plain, 3, 2 * lanes, source, 5, 40, vector_token(lanes))
    assert np.array_equal(masked, plain)
    block = source[5 : 5 + lanes * 40].reshape(lanes, 40)[:, :lanes]
    written = plain[3 : 3 + lanes * 2 * lanes].reshape(lanes, 2 * lanes)[:, :lanes]
    assert np.array_equal(written, block.T)
