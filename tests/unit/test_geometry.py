import numpy as np
import pytest

from cso.geometry import make_geometry, normalize_padding, result_dtype


def test_output_size_formula():
    g = make_geometry((2, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3)
    assert g.output_shape == (2, 64, 112, 112)
    assert g.reduction_length == 3 * 7 * 7
    assert g.flops == 2 * 2 * 64 * 112 * 112 * 147


def test_padding_forms():
    assert normalize_padding(1, (3, 3), (1, 1)) == (1, 1, 1, 1)
    assert normalize_padding((1, 2), (3, 3), (1, 1)) == (1, 1, 2, 2)
    assert normalize_padding(((0, 1), (2, 3)), (3, 3), (1, 1)) == (0, 1, 2, 3)
    assert normalize_padding("valid", (3, 3), (1, 1)) == (0, 0, 0, 0)
    # "same": total dilation*(R-1), the odd element at the bottom/right.
    assert normalize_padding("same", (4, 3), (1, 2)) == (1, 2, 2, 2)


def test_same_keeps_size_at_stride_one():
    g = make_geometry((1, 2, 9, 8), (3, 2, 4, 3), padding="same", dilation=2)
    assert (g.out_height, g.out_width) == (9, 8)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(stride=0), ValueError, "stride"),
        (dict(stride=(1, 2, 3)), ValueError, "stride"),
        (dict(stride=1.5), TypeError, "stride"),
        (dict(dilation=0), ValueError, "dilation"),
        (dict(padding=-1), ValueError, "padding"),
        (dict(padding="full"), ValueError, "padding"),
        (dict(padding=((1, 2), (3,))), ValueError, "padding[1]"),
        (dict(groups=0), ValueError, "groups"),
        (dict(groups=True), TypeError, "groups"),
        (dict(padding="same", stride=2), ValueError, "same"),
    ],
)
def test_bad_parameters_name_themselves(kwargs, error, words):
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        make_geometry((1, 4, 8, 8), (4, 4, 3, 3), **kwargs)


def test_shape_errors():
    with pytest.raises(ValueError, match="x.shape"):
        make_geometry((1, 4, 8), (4, 4, 3, 3))
    with pytest.raises(ValueError, match=r"w.shape\[1\] must be"):
        make_geometry((1, 4, 8, 8), (4, 3, 3, 3))
    with pytest.raises(ValueError, match="groups"):
        make_geometry((1, 4, 8, 8), (6, 1, 3, 3), groups=4)
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        make_geometry((1, 4, 2, 8), (4, 4, 3, 3))
    with pytest.raises(ValueError, match=r"\(R\)"):
        make_geometry((1, 4, 8, 8), (4, 4, 0, 3))


def test_result_dtype_follows_numpy():
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    assert result_dtype(f32, f32) == f32
    assert result_dtype(f32, f64) == f64
    assert result_dtype(np.dtype(np.float16), f32) == f32
    assert result_dtype(np.dtype(np.int64), f32) == f64
    for bad in (np.complex64, np.bool_, object):
        with pytest.raises(TypeError, match="dtype"):
            result_dtype(np.dtype(bad), f32)


def test_lane_pack_targets_place_every_pixel_in_the_padded_plane():
    # A 3 x 4 plane, padding (2, 1) high and (1, 0) wide, a 3x2 filter: each
    # input pixel's vector goes to its own place inside the padding, each
    # filter tap's after the packed plane, and no two places overlap.
    from cso.analysis import lanes

    g = make_geometry((1, 8, 3, 4), (8, 1, 3, 2), padding=((2, 1), (1, 0)), groups=8)
    width_lanes = 8
    targets = lanes.pack_targets(g, width_lanes)
    pitch, rows = lanes.pitch(g), lanes.packed_rows(g)
    assert targets.dtype == np.intp and targets.shape == (3 * 4 + 3 * 2,)
    for f in range(3 * 4):
        i, j = divmod(f, 4)
        assert targets[f] == ((i + 2) * pitch + j + 1) * width_lanes
    assert list(targets[12:]) == [(rows * pitch + t) * width_lanes for t in range(6)]
    assert len(set(targets.tolist())) == targets.size
    assert targets.max() + width_lanes <= lanes.workspace_elements(g, width_lanes, 1)
