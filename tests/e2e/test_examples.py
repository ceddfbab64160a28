"""Named cases that exercise each edge of the tiling, and the call's conventions."""

import numpy as np
import pytest
from conftest import assert_matches_reference

import cso



def _check(rng, x_shape, w_shape, dtype=np.float32, bias=True, **params):
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if bias else None
    for schedule in ("IS", "WS"):
        plan = cso.plan_conv2d(x_shape, w_shape, dtype=dtype, schedule=schedule, **params)
        y = cso.conv2d(x, w, b, plan=plan, **params)
        assert_matches_reference(y, x, w, b, **params)
    return plan


@pytest.mark.parametrize(
    "name, x_shape, w_shape, params",
    [
        ("1x1", (1, 64, 14, 14), (128, 64, 1, 1), {}),
        ("1x1 stride 2", (1, 32, 15, 15), (40, 32, 1, 1), dict(stride=2)),
        # Packed channel by channel in blocks of tiles, the last tile past P*Q.
        (
            "1x1 over half a page, two groups, batch 2",
            (2, 40, 23, 29),
            (38, 20, 1, 1),
            dict(groups=2),
        ),
        # Planes over half a page, strides the vector copies gather across.
        ("1x1 stride (2, 3), batch 2", (2, 20, 41, 47), (24, 20, 1, 1), dict(stride=(2, 3))),
        (
            "1x1 stride 4, two groups",
            (1, 16, 64, 64),
            (18, 16 // 2, 1, 1),
            dict(stride=4, groups=2),
        ),
        ("7x7 stride 2 on 3 channels", (1, 3, 64, 64), (64, 3, 7, 7), dict(stride=2, padding=3)),
        ("windows not a multiple of Nwin", (1, 8, 7, 7), (16, 8, 3, 3), dict(padding=1)),
        ("K not a multiple of Nf", (1, 8, 12, 12), (29, 8, 3, 3), dict(padding=1)),
        ("input smaller than the kernel, padded", (1, 4, 2, 3), (6, 4, 5, 5), dict(padding=2)),
        ("P equal to 1", (1, 5, 3, 40), (7, 5, 3, 3), {}),
        ("Q equal to 1", (1, 5, 40, 3), (7, 5, 3, 3), {}),
        ("P and Q equal to 1", (2, 9, 4, 4), (11, 9, 4, 4), {}),
        ("16x16 stride 16", (1, 3, 64, 64), (24, 3, 16, 16), dict(stride=16)),
        ("depthwise", (1, 12, 9, 9), (12, 1, 3, 3), dict(groups=12, padding=1)),
        ("batch of 3, dilation 2", (3, 6, 12, 12), (10, 6, 3, 3), dict(dilation=2, padding="same")),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_named_example(rng, name, x_shape, w_shape, params, dtype):
    _check(rng, x_shape, w_shape, dtype, **params)


def test_channels_split_into_several_tiles(rng):
    from cso.analysis.detect import detect_hardware
    from cso.analysis.retile import with_tiles
    from cso.analysis.tiles import filter_vector_blocks

    # 23 filters: the last filter tile is partial for every tile of 2 to 22
    # filters, and the only one for a tile of 32.  This machine's own shapes:
    # wider vectors than it has are emulated, and compiling them took this
    # test over two minutes on an AVX2 machine.
    hardware = detect_hardware()
    filters_shape = filter_vector_blocks(hardware.vector_bytes, hardware.vector_registers, 4)[0]
    x = rng.standard_normal((1, 300, 9, 9)).astype(np.float32)
    w = rng.standard_normal((23, 300, 3, 3)).astype(np.float32)
    b = rng.standard_normal(23).astype(np.float32)
    # Packed filters, and filters read in place, whose last tile is then the
    # KCRS rows ending at K, accumulated tile by tile.
    for vector_operand, shape in (("filters", filters_shape), ("windows", None)):
        for schedule in ("IS", "WS"):
            for channel_tile in (7, 64, 151):  # 43, 5 and 2 channel tiles, uneven splits
                tile = dict(filters_per_tile=shape[0], windows_per_tile=shape[1]) if shape else {}
                plan = with_tiles(
                    cso.plan_conv2d(
                        x.shape, w.shape, padding=1, vector_operand=vector_operand, **tile
                    ),
                    schedule=schedule,
                    channel_tile=channel_tile,
                )
                assert plan.channel_tile == channel_tile
                assert w.shape[0] % plan.filters_per_tile or plan.filters_per_tile > 23
                y = cso.conv2d(x, w, b, padding=1, plan=plan)
                assert_matches_reference(y, x, w, b, padding=1)


def test_result_dtype_and_mixed_inputs(rng):
    x = rng.standard_normal((1, 3, 8, 8))
    w32 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    assert cso.conv2d(x.astype(np.float32), w32).dtype == np.float32
    y = cso.conv2d(x, w32)
    assert y.dtype == np.float64
    assert_matches_reference(y, x, w32.astype(np.float64))
    ints = np.arange(3 * 8 * 8, dtype=np.int32).reshape(1, 3, 8, 8)
    assert cso.conv2d(ints, w32).dtype == np.float64
    assert cso.conv2d(x.astype(np.float16), w32).dtype == np.float32


def test_array_likes_and_non_contiguous_inputs(rng):
    x = rng.standard_normal((1, 3, 10, 16)).astype(np.float32)[:, :, :, ::2]
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    assert not x.flags.c_contiguous
    assert_matches_reference(cso.conv2d(x, w.tolist()), x, w)
    x.setflags(write=False)
    assert_matches_reference(cso.conv2d(x, w), x, w)


def test_out_is_filled_and_returned(rng):
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    out = np.full((2, 5, 6, 6), np.nan, np.float32)
    assert cso.conv2d(x, w, out=out) is out
    assert_matches_reference(out, x, w)


def test_empty_batch():
    y = cso.conv2d(np.zeros((0, 3, 8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32))
    assert y.shape == (0, 4, 6, 6) and y.dtype == np.float32


def test_nan_and_inf_propagate_like_the_reference():
    x = np.ones((1, 2, 6, 6), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    x[0, 0, 2, 2] = np.nan
    x[0, 1, 5, 5] = np.inf
    y = cso.conv2d(x, w)
    expected = cso.reference.conv2d(x, w)
    assert np.array_equal(np.isnan(y), np.isnan(expected))
    assert np.array_equal(np.isinf(y), np.isinf(expected))
    finite = np.isfinite(expected)
    assert np.array_equal(y[finite], expected[finite].astype(np.float32))


def test_two_threads_match_one(rng):
    x = rng.standard_normal((2, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    one = cso.conv2d(x, w, padding=1, threads=1)
    two = cso.conv2d(x, w, padding=1, threads=min(2, cso.executor.available_threads()))
    assert_matches_reference(one, x, w, padding=1)
    assert_matches_reference(two, x, w, padding=1)


@pytest.mark.parametrize(
    "x_shape, w_shape, params",
    [
        ((1, 16, 40, 40), (20, 16, 1, 1), {}),  # allowed, on a plane the planner would pack
        ((1, 16, 21, 21), (20, 16, 1, 1), dict(stride=2)),  # windows not contiguous in x
        ((1, 16, 12, 12), (20, 16, 1, 1), dict(padding=1)),
        ((1, 16, 12, 12), (20, 16, 3, 3), {}),
    ],
)
def test_hand_made_plan_reading_the_input_in_place(rng, x_shape, w_shape, params):
    # A plan may read x in place only where its layout allows: the loop nests
    # trust the plan, so a plan that says otherwise cannot be made.
    import dataclasses

    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    plan = cso.plan_conv2d(x_shape, w_shape, threads=1, **params)
    if (x_shape, w_shape, params) != ((1, 16, 40, 40), (20, 16, 1, 1), {}):
        with pytest.raises(ValueError, match="input_in_place=True needs a 1x1"):
            dataclasses.replace(plan, input_in_place=True)
        return
    forced = dataclasses.replace(plan, input_in_place=True, pack_channels_outer=False)
    assert_matches_reference(cso.conv2d(x, w, plan=forced, **params), x, w, **params)
