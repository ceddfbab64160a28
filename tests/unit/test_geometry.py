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
