"""The lane kernels' generation-time tables: the transpose rounds and which
input column feeds which output."""

import numpy as np
import pytest

from cso.microkernels.lane_taps import build_lane_tap_kernel, column_uses, transpose_order


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
def test_the_perfect_shuffle_rounds_transpose(lanes):
    square = np.arange(lanes * lanes).reshape(lanes, lanes)
    vectors = list(square)
    low, high = transpose_order(lanes)
    for _ in range(lanes.bit_length() - 1):
        paired = []
        for i in range(lanes // 2):
            both = np.concatenate([vectors[i], vectors[i + lanes // 2]])
            paired += [both[low], both[high]]
        vectors = paired
    assert np.array_equal(np.array(vectors), square.T)


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
