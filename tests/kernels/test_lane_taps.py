"""The lane kernels: packing and unpacking a block of channels (the
in-register transpose), which input column feeds which output, their checks."""

import numpy as np
import pytest

import numba

from cso.microkernels.lane_taps import build_lane_tap_kernel, column_uses
from cso.microkernels.lane_transposes import build_lane_pack, build_lane_unpack


@pytest.mark.parametrize("dtype, lanes", [("float32", 16), ("float64", 8), ("float32", 4)])
@pytest.mark.parametrize("block", ["partial", "whole"])
def test_pack_and_unpack_transpose_a_block_of_channels(dtype, lanes, block):
    # 3 real channels (or a whole block of them) of a 5 x 4 plane, packed
    # into rows of 6 pixel vectors one row and column in (the contract's
    # padding), then unpacked; runs of VL pixels wrap from row to row, and
    # whole runs of a whole block take the kernels' unmasked path.
    pack, unpack = build_lane_pack(dtype, lanes), build_lane_unpack(dtype, lanes)
    height, width, pitch = 5, 4, 6
    valid = 3 if block == "partial" else lanes
    plane = height * width

    @numba.njit
    def round_trip(x, packed, targets, staged, y):
        for f0 in range(0, plane, lanes):
            count = min(lanes, plane - f0)
            pack(x, f0, plane, count, valid, packed, targets, f0)
        for f0 in range(0, plane, lanes):
            count = min(lanes, plane - f0)
            unpack(staged, f0 * lanes, count, valid, y, f0, plane, y, 0, False)

    rng = np.random.default_rng(0)
    x = rng.standard_normal(valid * plane).astype(dtype)
    packed = np.full((height + 2) * pitch * lanes, 7.0, dtype)
    staged = np.zeros((plane + lanes) * lanes, dtype)
    staged[: plane * lanes] = rng.standard_normal(plane * lanes)
    y = np.full(valid * plane, 9.0, dtype)
    rows, columns = np.divmod(np.arange(plane), width)
    targets = ((rows + 1) * pitch + columns + 1) * lanes
    round_trip(x, packed, targets.astype(np.intp), staged, y)
    grid = packed.reshape(height + 2, pitch, lanes)
    inside = grid[1 : 1 + height, 1 : 1 + width]
    expected = np.zeros((height, width, lanes), dtype)
    expected[..., :valid] = x.reshape(valid, height, width).transpose(1, 2, 0)
    assert np.array_equal(inside, expected)
    # Outside the plane nothing is written (the nest zeroes the padding).
    assert np.all(grid[0] == 7.0) and np.all(grid[:, 0] == 7.0)
    assert np.array_equal(
        y.reshape(valid, plane), staged[: plane * lanes].reshape(plane, lanes)[:, :valid].T
    )


def test_column_uses_cover_every_tap_once():
    for outputs, width, stride, dilation in (
        (7, 5, 1, 1),
        (4, 3, 2, 1),
        (5, 3, 2, 2),
        (3, 7, 1, 3),
    ):
        uses = column_uses(outputs, width, stride, dilation)
        pairs = [pair for feeds in uses for pair in feeds]
        assert sorted(pairs) == [(q, s) for q in range(outputs) for s in range(width)]
        for c, feeds in enumerate(uses):
            assert all(q * stride + s * dilation == c for q, s in feeds)


def test_kernel_shapes_are_validated():
    with pytest.raises(ValueError, match="outputs must be in"):
        build_lane_tap_kernel(3, 1, 1, 0, "float32", 16)
    with pytest.raises(ValueError, match="vector_lanes must be a power of two"):
        build_lane_tap_kernel(3, 1, 1, 4, "float32", 12)
    with pytest.raises(ValueError, match="dtype_name must be"):
        build_lane_tap_kernel(3, 1, 1, 4, "int8", 16)
