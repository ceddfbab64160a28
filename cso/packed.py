"""Filters packed ahead of time: :func:`pack_filters` and :class:`PackedFilters`.

In inference the filters are constants: :func:`pack_filters` plans the
convolution for an input shape and packs the filters into that plan's
panels once; ``cso.conv2d(x, packed)`` then skips filter packing.  Keeping
them in a file is :mod:`cso.packed_file`'s job.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from .analysis.choices import KCRS_ALGORITHMS, Algorithm, VectorOperand
from .analysis.plan import Plan, check_plan
from .analysis.planner import plan_conv2d
from .checks import as_array, check_bias, check_ndim, check_plannable_batch
from .geometry import SUPPORTED_DTYPES, ceil_div, make_geometry
from .packing.filters import pack_bias, pack_filters_panels, pack_filters_rows
from .packing.winograd_filters import pack_winograd_filters, transformed_elements

@dataclass(frozen=True, eq=False)
class PackedFilters:
    """Filters packed into the panels of one plan.

    Attributes
    ----------
    panels : numpy.ndarray
        1-D, ``[G][T_f][C_g*R*S][Nf]`` (see :mod:`cso.packing.filters`); the
        KCRS rows for the tap, lane, plane and row plans; the transformed
        filters for a Winograd plan (:mod:`cso.packing.winograd_filters`).
        Treat as read-only: the checksum is taken when saving.
    bias : numpy.ndarray or None
        ``[G][T_f*Nf]``, zero past each group's filters.
    w_shape, input_shape : tuple
        ``(K, C // groups, R, S)`` and ``(N, C, H, W)`` the plan is for.
    stride, dilation : (int, int)
    padding : (top, bottom, left, right)
    groups : int
    plan : Plan
    """

    panels: np.ndarray
    bias: np.ndarray | None
    w_shape: tuple
    input_shape: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    plan: Plan

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.plan.dtype)

    @property
    def conv_params(self) -> dict:
        """``stride``, ``padding``, ``dilation``, ``groups`` as :func:`cso.conv2d` takes them."""
        top, bottom, left, right = self.padding
        return {
            "stride": self.stride,
            "padding": ((top, bottom), (left, right)),
            "dilation": self.dilation,
            "groups": self.groups,
        }

    def describe(self) -> dict:
        """The layer's metadata entry, without its checksum (see the module docstring)."""
        return {
            "w_shape": list(self.w_shape),
            "input_shape": list(self.input_shape),
            "stride": list(self.stride),
            "padding": list(self.padding),
            "dilation": list(self.dilation),
            "groups": self.groups,
            "dtype": self.plan.dtype,
            "has_bias": self.bias is not None,
            "plan": self.plan.to_dict(),
        }

    def sha256(self) -> str:
        """The checksum of :meth:`describe` (canonical JSON), the panels and the bias."""
        return checksum(self.describe(), self.panels, self.bias)

    def __repr__(self) -> str:
        return (
            f"PackedFilters(w_shape={self.w_shape}, input_shape={self.input_shape}, "
            f"dtype={self.dtype.name}, micro_kernel={self.plan.filters_per_tile}x"
            f"{self.plan.windows_per_tile}, schedule={self.plan.schedule})"
        )


def bias_tile(plan) -> int:
    """Filters each group's packed bias is padded to a multiple of
    (:func:`cso.packing.filters.pack_bias`): the plan's filter tile, but 1
    for a row plan, whose filters side by side (``filters_per_tile``) are of
    different groups, each reading its bias as given."""
    return 1 if plan.algorithm == Algorithm.DEPTHWISE_ROWS else plan.filters_per_tile


def checksum(entry: dict, panels, bias) -> str:
    """SHA-256 of ``entry`` as canonical JSON (sorted keys, no spaces), then the
    panels' and the bias's bytes: what a packed file's layer checksum is."""
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode())
    digest.update(np.ascontiguousarray(panels).tobytes())
    if bias is not None:
        digest.update(np.ascontiguousarray(bias).tobytes())
    return digest.hexdigest()


def packed_elements(plan: Plan, w_shape) -> int:
    """Elements of the filters packed for ``plan``: the transformed filters
    of a Winograd plan (:mod:`cso.packing.winograd_filters`), the KCRS rows
    of the tap, lane, plane and row plans and of dot products, else the
    dense panels (:func:`panel_size`)."""
    if plan.algorithm == Algorithm.WINOGRAD:
        return transformed_elements(w_shape, plan.filters_per_tile, plan.dtype)[1]
    if plan.vector_operand == VectorOperand.REDUCTION or plan.algorithm in KCRS_ALGORITHMS:
        return int(np.prod(w_shape))
    return panel_size(w_shape, plan.geometry.groups, plan.filters_per_tile)


def panel_size(w_shape, groups, filters_per_tile) -> int:
    """Elements of the dense panels: ``G * ceil(K_g / Nf) * C_g*R*S * Nf``."""
    filters, channels_per_group, height, width = w_shape
    tiles_per_group = ceil_div(filters // groups, filters_per_tile)
    return groups * tiles_per_group * channels_per_group * height * width * filters_per_tile


def pack_filters(
    w,
    input_shape,
    *,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    bias=None,
    hardware=None,
    dtype=None,
    threads=None,
    plan=None,
) -> PackedFilters:
    """Plan the convolution of ``input_shape`` by ``w`` and pack ``w`` for it.

    Parameters
    ----------
    w : array_like, shape (K, C // groups, R, S)
    input_shape : tuple of 4 ints
        ``(N, C, H, W)`` of the inputs the filters will meet.
    stride, padding, dilation, groups
        As for :func:`cso.conv2d`.
    bias : array_like, shape (K,), optional
        Packed alongside; ``cso.conv2d(x, packed)`` then adds it.
    hardware : Hardware, optional
        The machine to plan for (default: this one).
    dtype : float32 or float64, optional
        Precision of the panels (default: ``np.result_type(w, np.float32)``).
    threads : int, optional
        Workers to plan for (default: all cores).
    plan : Plan, optional
        Pack for this plan instead of the analysis' own: one for exactly
        this problem and dtype, such as ``cso.plan_conv2d(...,
        filters_prepacked=True)`` with a setting forced.

    Returns
    -------
    PackedFilters
    """
    w = as_array(w, "w")
    check_ndim(w, "w", "(K, C // groups, R, S)")
    dtype = np.result_type(w.dtype, np.float32) if dtype is None else np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    geometry = make_geometry(input_shape, w.shape, **params)
    check_plannable_batch(geometry.batch, "input_shape")
    bias = check_bias(bias, geometry.filters)
    if plan is None:
        plan = plan_conv2d(
            input_shape,
            w.shape,
            dtype=dtype,
            hardware=hardware,
            threads=threads,
            filters_prepacked=True,
            **params,
        )
    else:
        check_plan(plan, geometry, dtype)
    if plan.algorithm == Algorithm.WINOGRAD:
        # The transformed filters, which the call then does not transform.
        panels = pack_winograd_filters(w, plan.filters_per_tile, dtype)
    elif plan.vector_operand == VectorOperand.REDUCTION or plan.algorithm in KCRS_ALGORITHMS:
        # Dot products and the tap kernel read each filter as a row: the KCRS
        # array is the panel.
        panels = pack_filters_rows(w, dtype)
    else:
        panels = pack_filters_panels(
            w, geometry.groups, plan.filters_per_tile, dtype, plan.vector_lanes
        )
    packed_bias = (
        None
        if bias is None
        else pack_bias(bias, geometry.filters, geometry.groups, bias_tile(plan), dtype)
    )
    return PackedFilters(
        panels=panels,
        bias=packed_bias,
        w_shape=tuple(int(d) for d in w.shape),
        input_shape=tuple(int(d) for d in input_shape),
        stride=(geometry.stride_h, geometry.stride_w),
        padding=(geometry.pad_top, geometry.pad_bottom, geometry.pad_left, geometry.pad_right),
        dilation=(geometry.dilation_h, geometry.dilation_w),
        groups=geometry.groups,
        plan=plan,
    )


