"""Filter-vectorised plans that pack each filter tile in the loop nest, just
before its use: against the float64 reference, and bit-identical to the
same plan on panels packed up front (the same transposes, the same sums)."""

import dataclasses

import numpy as np
import pytest
from conftest import activate, activation_bound, error_bound

import cso
from cso.analysis.detect import detect_hardware
from cso.analysis.retile import with_tiles
from cso.analysis.tiles import filter_vector_blocks
from cso.executor import FilterOperands, filter_operands, run
from cso.packing.filters import pack_filters_panels


def in_nest_plan(x_shape, w_shape, dtype, threads, channel_tile, **params):
    """A WS filter-vectorised plan of this machine's first filter-vectorised
    shape (32x14 with AVX-512, 16x6 with AVX2; half the filters in float64)
    with every window tile in one block, ``channel_tile`` channels a tile
    (or the model's)."""
    hardware = detect_hardware()
    filters, windows = filter_vector_blocks(
        hardware.vector_bytes, hardware.vector_registers, np.dtype(dtype).itemsize
    )[0]
    plan = cso.plan_conv2d(
        x_shape, w_shape, dtype=dtype, threads=threads, filters_per_tile=filters,
        windows_per_tile=windows, vector_operand="filters", schedule="WS", **params,
    )  # fmt: skip
    if channel_tile:
        plan = with_tiles(plan, channel_tile=channel_tile)
    window_tiles = -(-plan.window_count // plan.windows_per_tile)
    if plan.l2_tiles < window_tiles:
        plan = with_tiles(plan, l2_tiles=window_tiles)
    # The workers split the filter blocks, never the windows.
    return dataclasses.replace(plan, window_parts=1)


@pytest.mark.parametrize(
    "x_shape, w_shape, params, channel_tile",
    [
        # 1x1, K not a multiple of Nf (8 to 48): the last tile's filters past K are zeros.
        ((1, 40, 14, 14), (70, 40, 1, 1), dict(), None),
        # 3x3 in three channel tiles: each packs its own rows of every filter tile.
        ((1, 24, 9, 11), (48, 24, 3, 3), dict(padding=1), 8),
        # Groups of fewer filters than a tile (4, a tile 8 or more): the rest zeros.
        ((1, 32, 14, 14), (16, 8, 3, 3), dict(padding=1, groups=4), None),
        # Grouped, strided, asymmetric padding.
        ((1, 32, 15, 13), (64, 16, 3, 3), dict(stride=2, padding=((1, 0), (0, 1)), groups=2), 5),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_packing_in_the_nest_matches_the_reference(
    rng, x_shape, w_shape, params, channel_tile, dtype, threads
):
    plan = in_nest_plan(x_shape, w_shape, dtype, threads, channel_tile, **params)
    assert plan.packs_filters_in_nest and plan.channel_tile == (channel_tile or plan.channel_tile)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    residual = rng.standard_normal(plan.geometry.output_shape).astype(dtype)
    y = cso.conv2d(x, w, b, plan=plan, activation="relu", residual=residual, **params)
    before = cso.reference.conv2d(x, w, b, **params) + residual
    bound = error_bound(x, w, b, dtype, **params) + np.finfo(dtype).eps * np.abs(residual)
    assert np.all(np.abs(y - activate("relu", before)) <= activation_bound(before, bound, dtype))
    # The nest read the KCRS filters, not panels; on panels packed up front
    # the same plan's result is the same to the bit.
    operands = filter_operands(w, b, plan)
    assert not operands.packed and operands.edge.size >= 1
    panels = pack_filters_panels(
        w, plan.geometry.groups, plan.filters_per_tile, dtype, plan.vector_lanes
    )
    up_front = FilterOperands(panels, panels[:1], True, operands.bias, True)
    plain = cso.conv2d(x, w, b, plan=plan, **params)
    assert np.array_equal(run(plan, x, up_front, np.empty_like(plain)), plain)


def test_the_rule_packs_in_the_nest_only_where_each_tile_is_packed_once():
    from cso.analysis.tiles import packs_filters_in_nest

    args = dict(
        schedule="WS", vector_operand="filters", filters_prepacked=False, window_parts=1,
        image_jobs=1, l2_tiles=14, window_tiles=14,
    )  # fmt: skip
    assert packs_filters_in_nest(**args)
    for change in (
        dict(schedule="IS"),  # IS streams every filter tile past each window block
        dict(vector_operand="windows"),  # read in place, nothing to pack
        dict(filters_prepacked=True),
        dict(window_parts=2),  # each part's worker would pack every tile
        dict(image_jobs=2),  # each image's job would pack every tile
        dict(l2_tiles=7),  # each of two window blocks would pack every tile
    ):
        assert not packs_filters_in_nest(**dict(args, **change)), change
