"""The reference itself, against the definition (a naive loop) on tiny cases."""

import numpy as np
import pytest

import cso


@pytest.mark.parametrize(
    "x_shape, w_shape, params",
    [
        ((1, 1, 5, 5), (1, 1, 3, 3), dict()),
        ((2, 3, 6, 7), (4, 3, 2, 3), dict(stride=(2, 1), padding=((1, 0), (0, 2)))),
        ((1, 4, 7, 7), (6, 2, 3, 3), dict(groups=2, dilation=2, padding=2)),
        ((1, 2, 5, 4), (3, 2, 3, 2), dict(padding="same")),
        ((1, 3, 2, 2), (2, 3, 5, 5), dict(padding=2)),
    ],
)
def test_reference_equals_naive_loop(rng, x_shape, w_shape, params):
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    bias = rng.standard_normal(w_shape[0])
    expected = cso.reference.naive_conv2d(x, w, bias, **params)
    np.testing.assert_allclose(
        cso.reference.conv2d(x, w, bias, **params), expected, rtol=1e-12, atol=1e-12
    )


def test_reference_is_float64(rng):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    assert cso.reference.conv2d(x, w).dtype == np.float64
