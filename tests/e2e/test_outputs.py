"""Outputs cso allocates: fresh, C-contiguous, on a cache line (the dense
kernels' whole-vector stores along output rows then split no line they need
not), but for the depthwise families whose nests that alignment does not
speed up, in their repeated calls (cso.repeated.UNALIGNED_OUTPUT_ALGORITHMS)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import cso
from cso.outputs import new_output


@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=4),
    st.sampled_from([np.float32, np.float64]),
)
def test_outputs_are_fresh_c_contiguous_and_start_on_a_cache_line(shape, dtype):
    first, second = new_output(shape, dtype), new_output(shape, dtype)
    for y in (first, second):
        assert y.shape == tuple(shape) and y.dtype == dtype and y.flags.c_contiguous
        assert y.flags.writeable
        assert y.size == 0 or y.ctypes.data % 64 == 0  # an empty array has no data to place
    assert not np.shares_memory(first, second)


def test_conv2d_returns_an_output_on_a_cache_line():
    # A first call, through the general path, which aligns every family's
    # output; the repeated calls of UNALIGNED_OUTPUT_ALGORITHMS' families
    # need not (tests/e2e/test_repeated.py).
    x = np.ones((1, 3, 9, 7), np.float32)
    for w, params in ((np.ones((5, 3, 3, 3), np.float32), {}),
                      (np.ones((3, 1, 3, 3), np.float32), dict(groups=3, padding=1))):  # fmt: skip
        assert cso.conv2d(x, w, **params).ctypes.data % 64 == 0
