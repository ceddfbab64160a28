"""The Winograd family's analysis: its tiles, blocks and plane strides, and
the tests' own float64 Winograd (the error bound's basis) against the
reference convolution."""

import numpy as np
from conftest import winograd_float64
from hypothesis import given
from hypothesis import strategies as st

import cso
from cso.analysis import winograd
from cso.geometry import make_geometry


@given(st.integers(1, 5000), st.sampled_from([4, 8]))
def test_plane_strides_start_each_plane_in_its_own_l1_set(elements, element_bytes):
    stride = winograd.plane_stride(elements, element_bytes)
    lines = stride * element_bytes // 64
    assert stride >= elements and stride * element_bytes % 64 == 0 and lines % 2 == 1
    sets = {(e * lines) % 64 for e in range(16)}
    assert len(sets) == 16


@given(st.integers(1, 4000), st.sampled_from([16, 32, 48]), st.integers(1, 4),
       st.integers(1, 4), st.integers(1, 200))  # fmt: skip
def test_blocks_cover_the_tiles_in_whole_kernel_calls(tiles, nwin, threads, batch, largest):
    per_block = winograd.block_tiles(tiles, nwin, threads, batch, largest)
    sizes = winograd.block_sizes(tiles, per_block)
    assert per_block % nwin == 0 and sum(sizes) == tiles
    assert all(0 < size <= per_block for size in sizes)
    # No more blocks than the larger of the cache's and the threads' rule asks.
    assert per_block <= max(nwin, -(-largest // nwin) * nwin) or len(sizes) == 1


@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.integers(1, 11),
       st.integers(1, 11), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2),
       st.integers(0, 2), st.integers(0, 2**32 - 1))  # fmt: skip
def test_the_tests_winograd_is_the_convolution(n, c, k, h, w, top, bottom, left, right, seed):
    padding = ((top, bottom), (left, right))
    try:
        make_geometry((n, c, h, w), (k, c, 3, 3), padding=padding)
    except ValueError:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    f = rng.standard_normal((k, c, 3, 3))
    np.testing.assert_allclose(
        winograd_float64(x, f, padding=padding),
        cso.reference.conv2d(x, f, padding=padding),
        rtol=1e-12, atol=1e-12,
    )  # fmt: skip


def test_modelled_multiply_adds_are_the_products_padded_to_whole_calls():
    g = make_geometry((1, 64, 56, 56), (64, 64, 3, 3), padding=1)
    hardware = cso.Hardware(l1_bytes=48 << 10, l2_bytes=2 << 20, l3_bytes=32 << 20,
                            vector_bytes=64, vector_registers=32, cores=2)  # fmt: skip
    traffic = winograd.winograd_traffic(g, hardware, 4, 1, 8, 48)
    # 784 tiles in blocks of 96: 8 blocks of 2 calls and one of 16 tiles (1 call).
    assert traffic.padded_macs == 16 * 64 * 64 * (8 * 96 + 48)
    assert traffic.kernel_calls == 16 * 8 * 17
