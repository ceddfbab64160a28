"""Filters packed ahead of time, and the file format that keeps them.

In inference the filters are constants: :func:`pack_filters` plans the
convolution for an input shape and packs the filters into that plan's
panels once; ``cso.conv2d(x, packed)`` then skips filter packing.

File format (``save_packed`` / ``load_packed``)
------------------------------------------------
An ``.npz`` archive read with ``allow_pickle=False``.  Member
``__metadata__`` is a UTF-8 JSON document (as a ``uint8`` array)::

    {"format": "cso-packed-filters", "format_version": 1, "cso_version": ...,
     "micro_kernels": [{"filters_per_tile": Nf, "windows_per_tile": Nwin,
                        "dtype": ..., "vector_lanes": ...}, ...],   # the shapes used
     "hardware": {...},                                     # what the plans assumed
     "layers": {name: {"w_shape", "input_shape", "stride", "padding",
                       "dilation", "groups", "dtype", "has_bias",
                       "plan": Plan.to_dict(), "sha256": ...}}}

and for each layer ``NAME``, member ``NAME/panels`` (1-D, the plan's filter
panels, :mod:`cso.packing.filters`) and, with a bias, ``NAME/bias``.  The
SHA-256 covers the panels' and bias's bytes.  Everything is checked on load;
any inconsistency raises :class:`PackedFormatError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from ._version import __version__
from .analysis import tiles
from .analysis.choices import Algorithm, VectorOperand
from .analysis.depthwise import MAX_SEGMENT_VECTORS
from .analysis.detect import detect_hardware
from .analysis.plan import Plan, check_plan
from .analysis.planner import plan_conv2d
from .checks import as_array, check_bias, check_ndim
from .geometry import SUPPORTED_DTYPES, ceil_div, make_geometry
from .packing.filters import aligned_empty, pack_bias, pack_filters_panels, pack_filters_rows

FORMAT = "cso-packed-filters"
FORMAT_VERSION = 2  # 2: the plan's hardware nests its cost weights
_METADATA = "__metadata__"


class PackedFormatError(ValueError):
    """A packed-filters file that is damaged, inconsistent or not for this machine."""


@dataclass(frozen=True, eq=False)
class PackedFilters:
    """Filters packed into the panels of one plan.

    Attributes
    ----------
    panels : numpy.ndarray
        1-D, ``[G][T_f][C_g*R*S][Nf]`` (see :mod:`cso.packing.filters`).
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

    def sha256(self) -> str:
        digest = hashlib.sha256(np.ascontiguousarray(self.panels).tobytes())
        if self.bias is not None:
            digest.update(np.ascontiguousarray(self.bias).tobytes())
        return digest.hexdigest()

    def __repr__(self) -> str:
        return (
            f"PackedFilters(w_shape={self.w_shape}, input_shape={self.input_shape}, "
            f"dtype={self.dtype.name}, micro_kernel={self.plan.filters_per_tile}x"
            f"{self.plan.windows_per_tile}, schedule={self.plan.schedule})"
        )


def _panel_size(w_shape, groups, filters_per_tile) -> int:
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
    if plan.vector_operand == VectorOperand.REDUCTION or plan.algorithm == Algorithm.DEPTHWISE:
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
        else pack_bias(bias, geometry.filters, geometry.groups, plan.filters_per_tile, dtype)
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


def _micro_kernel(plan: Plan) -> dict:
    return {
        "filters_per_tile": plan.filters_per_tile,
        "windows_per_tile": plan.windows_per_tile,
        "dtype": plan.dtype,
        "vector_lanes": plan.vector_lanes,
    }


def save_packed(path, layers: dict) -> None:
    """Write ``{name: PackedFilters}`` to ``path`` (an ``.npz``; see the module docstring)."""
    if not isinstance(layers, dict) or not layers:
        raise ValueError("layers must be a non-empty dict of name -> PackedFilters")
    arrays, described, kernels = {}, {}, {}
    hardware = None
    for name, packed in layers.items():
        if not isinstance(name, str) or not name or "/" in name or name == _METADATA:
            raise ValueError(f"layer names must be non-empty strings without '/', got {name!r}")
        if not isinstance(packed, PackedFilters):
            raise TypeError(
                f"layers[{name!r}] must be a PackedFilters, got {type(packed).__name__}"
            )
        kernels[json.dumps(_micro_kernel(packed.plan), sort_keys=True)] = _micro_kernel(packed.plan)
        hardware = hardware or packed.plan.hardware
        arrays[f"{name}/panels"] = packed.panels
        if packed.bias is not None:
            arrays[f"{name}/bias"] = packed.bias
        described[name] = {
            "w_shape": list(packed.w_shape),
            "input_shape": list(packed.input_shape),
            "stride": list(packed.stride),
            "padding": list(packed.padding),
            "dilation": list(packed.dilation),
            "groups": packed.groups,
            "dtype": packed.plan.dtype,
            "has_bias": packed.bias is not None,
            "plan": packed.plan.to_dict(),
            "sha256": packed.sha256(),
        }
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "cso_version": __version__,
        "micro_kernels": list(kernels.values()),
        "hardware": hardware.to_dict(),
        "layers": described,
    }
    arrays[_METADATA] = np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)
    path = os.fspath(path)
    temporary = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(temporary, **arrays)
    os.replace(temporary, path)


def load_packed(path, *, hardware=None) -> dict:
    """Read and validate a file written by :func:`save_packed`.

    Parameters
    ----------
    path : str or path-like
    hardware : Hardware, optional
        The machine the panels will run on (default: this one); panels
        packed for another micro-kernel shape are refused.

    Returns
    -------
    dict of str to PackedFilters

    Raises
    ------
    PackedFormatError
        The file is missing, truncated or damaged, of an unknown format
        version, fails a checksum, or was packed for another micro-kernel.
    """
    hardware = detect_hardware() if hardware is None else hardware
    try:
        with np.load(os.fspath(path), allow_pickle=False) as archive:
            members = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise PackedFormatError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as error:
        raise PackedFormatError(
            f"{path}: not a readable packed-filters archive ({error})"
        ) from None
    if _METADATA not in members:
        raise PackedFormatError(f"{path}: no {_METADATA} member; not written by cso.save_packed")
    try:
        metadata = json.loads(members.pop(_METADATA).tobytes().decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise PackedFormatError(f"{path}: metadata is not valid JSON ({error})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise PackedFormatError(f"{path}: not a {FORMAT} file")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise PackedFormatError(
            f"{path}: format version {metadata.get('format_version')!r} is not supported "
            f"(this cso reads version {FORMAT_VERSION})"
        )
    try:
        return _layers(path, metadata, members, hardware)
    except PackedFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise PackedFormatError(f"{path}: malformed metadata ({error!r})") from None


def _layers(path, metadata, members, hardware) -> dict:
    listed = set()
    for kernel in metadata["micro_kernels"]:
        dtype_name = str(kernel["dtype"])
        shape = (int(kernel["filters_per_tile"]), int(kernel["windows_per_tile"]))
        element_bytes = np.dtype(dtype_name).itemsize
        usable = (
            tiles.register_blocks(hardware.vector_bytes, hardware.vector_registers, element_bytes)
            + tiles.filter_vector_blocks(
                hardware.vector_bytes, hardware.vector_registers, element_bytes
            )
            + tiles.dot_product_blocks(
                hardware.vector_bytes, hardware.vector_registers, element_bytes
            )
            # The depthwise tap kernel's row segments (its panels are KCRS rows).
            + [
                (1, vectors * max(1, hardware.vector_bytes // element_bytes))
                for vectors in range(1, MAX_SEGMENT_VECTORS + 1)
            ]
        )
        if shape not in usable:
            here = ", ".join(f"{nf}x{nwin}" for nf, nwin in usable)
            raise PackedFormatError(
                f"{path}: {dtype_name} panels were packed for a {shape[0]}x{shape[1]} "
                f"micro-kernel; this machine uses {here}: pack them again here"
            )
        listed.add((dtype_name, shape))
    layers = {}
    expected_members = set()
    for name, entry in metadata["layers"].items():
        plan = Plan.from_dict(entry["plan"])
        panels = members.get(f"{name}/panels")
        expected_members.add(f"{name}/panels")
        if panels is None:
            raise PackedFormatError(f"{path}: layer {name!r} has no panels")
        bias = None
        if entry["has_bias"]:
            expected_members.add(f"{name}/bias")
            bias = members.get(f"{name}/bias")
            if bias is None:
                raise PackedFormatError(f"{path}: layer {name!r} has no bias member")
        if (plan.dtype, (plan.filters_per_tile, plan.windows_per_tile)) not in listed:
            raise PackedFormatError(
                f"{path}: layer {name!r} uses a micro-kernel the file does not list"
            )
        w_shape = tuple(int(d) for d in entry["w_shape"])
        groups = int(entry["groups"])
        size = (
            int(np.prod(w_shape))
            if plan.vector_operand == VectorOperand.REDUCTION
            or plan.algorithm == Algorithm.DEPTHWISE
            else _panel_size(w_shape, groups, plan.filters_per_tile)
        )
        if panels.dtype != np.dtype(plan.dtype) or panels.shape != (size,):
            raise PackedFormatError(
                f"{path}: layer {name!r} panels are {panels.dtype} {panels.shape}, expected "
                f"{plan.dtype} ({size},)"
            )
        top, bottom, left, right = (int(p) for p in entry["padding"])
        geometry = make_geometry(
            entry["input_shape"],
            w_shape,
            stride=tuple(entry["stride"]),
            padding=((top, bottom), (left, right)),
            dilation=tuple(entry["dilation"]),
            groups=groups,
        )
        if geometry != plan.geometry:
            raise PackedFormatError(f"{path}: layer {name!r} plan is for another convolution")
        packed = PackedFilters(
            panels=_aligned_copy(panels),  # private, writeable, on a cache line
            bias=None if bias is None else np.array(bias),
            w_shape=w_shape,
            input_shape=tuple(int(d) for d in entry["input_shape"]),
            stride=(geometry.stride_h, geometry.stride_w),
            padding=(top, bottom, left, right),
            dilation=(geometry.dilation_h, geometry.dilation_w),
            groups=groups,
            plan=plan,
        )
        if packed.sha256() != entry["sha256"]:
            raise PackedFormatError(
                f"{path}: layer {name!r} fails its checksum: the file is damaged"
            )
        layers[name] = packed
    unexpected = set(members) - expected_members
    if unexpected:
        raise PackedFormatError(f"{path}: members without a layer entry: {sorted(unexpected)}")
    return layers


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A writeable copy of 1-D ``array`` starting on a 64-byte boundary, as
    the micro-kernels' vector loads of panel rows want it."""
    copy = aligned_empty(array.size, array.dtype)
    copy[:] = array
    return copy
