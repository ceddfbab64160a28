"""Convolution parameters: normalisation and validation, before any work.

Every public entry point turns its ``stride``, ``padding``, ``dilation`` and
``groups`` arguments into one frozen :class:`ConvGeometry`, so that the
analysis, the packing and the loops all see the same explicit numbers.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class ConvGeometry:
    """The full, explicit description of one 2-D convolution.

    Input ``x[N][C][H][W]``, filters ``w[K][C/groups][R][S]``, output
    ``y[N][K][P][Q]`` with
    ``P = (H + pad_top + pad_bottom - dilation_h * (R - 1) - 1) // stride_h + 1``
    and likewise ``Q``.
    """

    batch: int
    channels: int
    height: int
    width: int
    filters: int
    kernel_height: int
    kernel_width: int
    stride_h: int
    stride_w: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    dilation_h: int
    dilation_w: int
    groups: int

    @property
    def padded(self) -> bool:
        """Whether any side is padded."""
        return bool(self.pad_top or self.pad_bottom or self.pad_left or self.pad_right)

    @property
    def channels_per_group(self) -> int:
        return self.channels // self.groups

    @property
    def filters_per_group(self) -> int:
        return self.filters // self.groups

    @property
    def out_height(self) -> int:
        span = self.dilation_h * (self.kernel_height - 1) + 1
        return (self.height + self.pad_top + self.pad_bottom - span) // self.stride_h + 1

    @property
    def out_width(self) -> int:
        span = self.dilation_w * (self.kernel_width - 1) + 1
        return (self.width + self.pad_left + self.pad_right - span) // self.stride_w + 1

    @property
    def windows(self) -> int:
        """Output positions per image and filter, ``P * Q``."""
        return self.out_height * self.out_width

    @property
    def reduction_length(self) -> int:
        """Terms summed per output element, ``C/groups * R * S``."""
        return self.channels_per_group * self.kernel_height * self.kernel_width

    @property
    def output_shape(self) -> tuple:
        return (self.batch, self.filters, self.out_height, self.out_width)

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations: ``2 N K P Q (C/groups) R S``."""
        return 2 * self.batch * self.filters * self.windows * self.reduction_length


# Every extent and parameter fits a 32-bit int, so that no index or offset
# the loop nests compute from them overflows their 64-bit integers.
MAX_EXTENT = 2**31 - 1
# Elements of one output array at most (NumPy's own limit on one array).
_MAX_ELEMENTS = np.iinfo(np.intp).max // 8


def _positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if number > MAX_EXTENT:
        raise ValueError(f"{name} must be <= {MAX_EXTENT} (2**31 - 1), got {number}")
    return int(number)


def _pair(value, name: str, minimum: int) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair (h, w), got {value!r}")
        return (
            _positive_int(value[0], f"{name}[0]", minimum),
            _positive_int(value[1], f"{name}[1]", minimum),
        )
    number = _positive_int(value, name, minimum)
    return number, number


def normalize_padding(padding, kernel_shape, dilation) -> tuple:
    """Return ``(top, bottom, left, right)`` for any accepted ``padding`` form.

    ``"same"`` pads ``dilation * (R - 1)`` in total, the extra element (if the
    total is odd) at the bottom/right, as TensorFlow and PyTorch do; it keeps
    ``P == H`` only for stride 1, like PyTorch, which rejects it otherwise.
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return 0, 0, 0, 0
        if mode == "same":
            total_h = dilation[0] * (kernel_shape[0] - 1)
            total_w = dilation[1] * (kernel_shape[1] - 1)
            return (total_h // 2, total_h - total_h // 2, total_w // 2, total_w - total_w // 2)
        raise ValueError(f"padding must be 'valid', 'same', an int or pairs, got {padding!r}")
    if isinstance(padding, (tuple, list)):
        if len(padding) != 2:
            raise ValueError(
                f"padding must be an int, (h, w) or ((top, bottom), (left, right)), got {padding!r}"
            )
        if all(isinstance(p, (tuple, list)) for p in padding):
            (top, bottom), (left, right) = (
                _pair_exact(padding[0], "padding[0]"),
                _pair_exact(padding[1], "padding[1]"),
            )
            return top, bottom, left, right
        pad_h, pad_w = _pair(padding, "padding", 0)
        return pad_h, pad_h, pad_w, pad_w
    pad = _positive_int(padding, "padding", 0)
    return pad, pad, pad, pad


def _pair_exact(value, name):
    if len(value) != 2:
        raise ValueError(f"{name} must be a pair (before, after), got {value!r}")
    return (_positive_int(value[0], f"{name}[0]", 0), _positive_int(value[1], f"{name}[1]", 0))


def _shape(shape, name: str, letters: str) -> tuple:
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(
            f"{name} must be a shape of 4 integers ({letters}), got {shape!r}"
        ) from None
    if len(dims) != 4:
        raise ValueError(f"{name} must have 4 dimensions ({letters}), got {len(dims)}: {dims}")
    return tuple(_positive_int(d, f"{name}[{i}] ({letters[i]})", 0) for i, d in enumerate(dims))


def make_geometry(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1) -> ConvGeometry:
    """Validate the problem and return its :class:`ConvGeometry`.

    Raises
    ------
    TypeError, ValueError
        Naming the parameter and what was expected, for any shape or parameter
        that does not describe a valid convolution.
    """
    if (
        type(x_shape) is tuple
        and type(w_shape) is tuple
        and type(stride) is type(padding) is type(dilation) is type(groups) is int
        and all(type(d) is int for d in x_shape + w_shape)
    ):
        # The common call (NumPy shapes, int parameters) is its own key.
        return _make_geometry_cached(x_shape, w_shape, stride, padding, dilation, groups)
    key = _plain(
        (
            tuple(x_shape) if isinstance(x_shape, (tuple, list)) else x_shape,
            tuple(w_shape) if isinstance(w_shape, (tuple, list)) else w_shape,
            stride,
            padding,
            dilation,
            groups,
        )
    )
    if key is None:
        return _make_geometry(x_shape, w_shape, stride, padding, dilation, groups)
    return _make_geometry_cached(*key)


def _plain(value):
    """``value`` as nested tuples of exact ints and strs, or None (not memoisable:
    bools, NumPy scalars and other look-alikes must meet the full checks)."""
    if type(value) in (int, str):
        return value
    if type(value) in (tuple, list):
        items = tuple(_plain(item) for item in value)
        return None if any(item is None for item in items) else items
    return None


@functools.lru_cache(maxsize=4096)
def _make_geometry_cached(x_shape, w_shape, stride, padding, dilation, groups):
    # Validation is pure: a key seen before gives the same geometry (errors are
    # not cached by lru_cache, so they are raised afresh every time).
    return _make_geometry(x_shape, w_shape, stride, padding, dilation, groups)


def _make_geometry(x_shape, w_shape, stride, padding, dilation, groups) -> ConvGeometry:
    batch, channels, height, width = _shape(x_shape, "x.shape", "NCHW")
    filters, channels_per_group, kernel_h, kernel_w = _shape(w_shape, "w.shape", "KCRS")
    for value, name in (
        (channels, "x.shape[1] (C)"),
        (filters, "w.shape[0] (K)"),
        (channels_per_group, "w.shape[1] (C // groups)"),
        (kernel_h, "w.shape[2] (R)"),
        (kernel_w, "w.shape[3] (S)"),
        (height, "x.shape[2] (H)"),
        (width, "x.shape[3] (W)"),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    groups = _positive_int(groups, "groups")
    stride_h, stride_w = _pair(stride, "stride", 1)
    dilation_h, dilation_w = _pair(dilation, "dilation", 1)
    top, bottom, left, right = normalize_padding(
        padding, (kernel_h, kernel_w), (dilation_h, dilation_w)
    )
    if isinstance(padding, str) and padding.lower() == "same" and (stride_h, stride_w) != (1, 1):
        raise ValueError(f"padding='same' requires stride 1, got stride {(stride_h, stride_w)}")
    if channels % groups:
        raise ValueError(
            f"groups ({groups}) must divide the input channels x.shape[1] ({channels})"
        )
    if filters % groups:
        raise ValueError(f"groups ({groups}) must divide the filters w.shape[0] ({filters})")
    if channels_per_group != channels // groups:
        raise ValueError(
            f"w.shape[1] must be x.shape[1] // groups = {channels // groups}, "
            f"got {channels_per_group}"
        )
    geometry = ConvGeometry(
        batch,
        channels,
        height,
        width,
        filters,
        kernel_h,
        kernel_w,
        stride_h,
        stride_w,
        top,
        bottom,
        left,
        right,
        dilation_h,
        dilation_w,
        groups,
    )
    for extent, span, size, axis in (
        (height + top + bottom, dilation_h * (kernel_h - 1) + 1, height, "height"),
        (width + left + right, dilation_w * (kernel_w - 1) + 1, width, "width"),
    ):
        if extent < span:
            raise ValueError(
                f"the padded input {axis} ({extent}) is smaller than the dilated kernel "
                f"{axis} ({span}): the output would be empty"
            )
        if extent > MAX_EXTENT or span > MAX_EXTENT:
            raise ValueError(
                f"the padded input {axis} ({extent}) or the dilated kernel {axis} ({span}) "
                f"exceeds {MAX_EXTENT}: check padding and dilation"
            )
    elements = batch * filters * geometry.out_height * geometry.out_width
    if elements > _MAX_ELEMENTS:
        raise ValueError(
            f"the output would have shape {geometry.output_shape}, {elements:.3g} elements, "
            f"more than one array can hold: check padding {(top, bottom, left, right)}, "
            f"stride {(stride_h, stride_w)} and dilation {(dilation_h, dilation_w)}"
        )
    return geometry


def result_dtype(x_dtype, w_dtype) -> np.dtype:
    """``np.result_type(x, w, np.float32)``; complex, bool, object and others raise TypeError."""
    for dtype, name in ((x_dtype, "x"), (w_dtype, "w")):
        if dtype.kind not in "fiu":
            raise TypeError(f"{name} must have a real numeric dtype, got {dtype}")
    dtype = np.result_type(x_dtype, w_dtype, np.float32)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"the result dtype would be {dtype}; cso computes float32 and float64 only")
    return dtype


def ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


__all__ = [
    "ConvGeometry",
    "make_geometry",
    "normalize_padding",
    "result_dtype",
    "ceil_div",
    "SUPPORTED_DTYPES",
]
