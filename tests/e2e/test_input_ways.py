"""A 1x1 layer of small planes, its input read in place and packed into
panels (the two ways the planner weighs, ``CostWeights.in_place_input_cost``):
both against the float64 reference, per call and on filters packed ahead."""

import dataclasses

import numpy as np
import pytest

from conftest import assert_matches_reference

import cso


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "x_shape, filters",
    [((1, 96, 14, 14), 40), ((2, 64, 7, 7), 33), ((1, 256, 7, 7), 128)],
)
def test_input_read_in_place_and_packed_match_the_reference(x_shape, filters, dtype, threads):
    rng = np.random.default_rng(sum(x_shape) + filters)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((filters, x_shape[1], 1, 1)).astype(dtype)
    b = rng.standard_normal(filters).astype(dtype)
    for prepacked in (False, True):
        plan = cso.plan_conv2d(
            x.shape, w.shape, dtype=dtype, threads=threads, filters_prepacked=prepacked,
            fold_batch=False,
        )  # fmt: skip
        ways = {
            plan.input_in_place: plan,
            not plan.input_in_place: dataclasses.replace(
                plan, input_in_place=not plan.input_in_place,
                pack_channels_outer=plan.input_in_place,
            ),
        }  # fmt: skip
        assert set(ways) == {True, False}
        for in_place, way in ways.items():
            assert way.pack_channels_outer is not in_place
            if prepacked:
                y = cso.conv2d(x, cso.pack_filters(w, x.shape, bias=b, plan=way))
            else:
                y = cso.conv2d(x, w, b, plan=way)
            assert_matches_reference(y, x, w, b)
