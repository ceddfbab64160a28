"""The file that keeps packed filters: :func:`save_packed` and :func:`load_packed`.

File format (``save_packed`` / ``load_packed``)
------------------------------------------------
An ``.npz`` archive read with ``allow_pickle=False``.  Member
``__metadata__`` is a UTF-8 JSON document (as a ``uint8`` array)::

    {"format": "cso-packed-filters", "format_version": 3, "cso_version": ...,
     "micro_kernels": [{"filters_per_tile": Nf, "windows_per_tile": Nwin,
                        "dtype": ..., "vector_lanes": ...}, ...],   # the shapes used
     "hardware": {...},                                     # what the plans assumed
     "layers": {name: {"w_shape", "input_shape", "stride", "padding",
                       "dilation", "groups", "dtype", "has_bias",
                       "plan": Plan.to_dict(), "sha256": ...}}}

and, when a model was saved with the layers (an ONNX session's packed
state, :meth:`cso.onnx.InferenceSession.save`), ``"model": {"bytes": n,
"sha256": ...}`` and member ``__model__``, the model's bytes as ``uint8``;
and for each layer ``NAME``, member ``NAME/panels`` (1-D, the plan's filter
panels, :mod:`cso.packing.filters`) and, with a bias, ``NAME/bias``.  A
layer's SHA-256 covers its entry (every field but ``sha256``, as canonical
JSON: sorted keys, no spaces), then its panels' and bias's bytes, so an
edited plan fails it like a flipped panel bit.

Nothing in the file is trusted before it is checked (:mod:`cso.untrusted`):
the metadata is bounded JSON; member names are checked before any member is
read; each member's ``.npy`` header (dtype, shape) is checked against what
its layer's plan expects before its array is allocated; every plan is
validated field by field (:mod:`cso.analysis.plan_checks`) and against this
machine's micro-kernels.  Any failure raises :class:`PackedFormatError`.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ._version import __version__
from .analysis import tiles
from .analysis.detect import detect_hardware
from .analysis.plan import Plan
from .geometry import make_geometry
from .packing.filters import aligned_empty, padded_filters_per_group
from .packed import PackedFilters, bias_tile, checksum, packed_elements
from .untrusted import NpzMembers, UntrustedFileError, parse_json

FORMAT = "cso-packed-filters"
FORMAT_VERSION = 3  # 2: the plan's hardware nests its cost weights; 3: checksums cover metadata
_MAX_METADATA_BYTES = 64 * 1024 * 1024
_METADATA = "__metadata__"
_MODEL = "__model__"
_MAX_MODEL_BYTES = 2**31 - 1  # protobuf's limit on one message


class PackedFormatError(ValueError):
    """A packed-filters file that is damaged, inconsistent or not for this machine."""


def _micro_kernel(plan: Plan) -> dict:
    return {
        "filters_per_tile": plan.filters_per_tile,
        "windows_per_tile": plan.windows_per_tile,
        "dtype": plan.dtype,
        "vector_lanes": plan.vector_lanes,
    }


def save_packed(path, layers: dict, *, model: bytes = None) -> None:
    """Write ``{name: PackedFilters}`` to ``path`` (an ``.npz``; see the module
    docstring), with ``model``, the bytes of the model they belong to, if given."""
    if not isinstance(layers, dict) or not layers:
        raise ValueError("layers must be a non-empty dict of name -> PackedFilters")
    arrays, described, kernels = {}, {}, {}
    hardware = None
    for name, packed in layers.items():
        if not isinstance(name, str) or not name or "/" in name or name in (_METADATA, _MODEL):
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
        described[name] = dict(packed.describe(), sha256=packed.sha256())
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "cso_version": __version__,
        "micro_kernels": list(kernels.values()),
        "hardware": hardware.to_dict(),
        "layers": described,
    }
    if model is not None:
        if not isinstance(model, (bytes, bytearray)) or len(model) > _MAX_MODEL_BYTES:
            raise TypeError("model must be None or the bytes of a model (at most 2 GiB)")
        arrays[_MODEL] = np.frombuffer(bytes(model), dtype=np.uint8)
        metadata["model"] = {"bytes": len(model), "sha256": hashlib.sha256(model).hexdigest()}
    arrays[_METADATA] = np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory: give the packed file's name")
    # Written beside its destination, then renamed: a reader never sees half a
    # file, and a failed write leaves nothing behind.
    directory, base = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".{base}.{os.getpid()}.tmp.npz")
    try:
        np.savez(temporary, **arrays)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


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
    return load_packed_model(path, hardware=hardware)[0]


def load_packed_model(path, *, hardware=None) -> tuple:
    """:func:`load_packed`, and the model saved with the layers:
    ``(layers, model bytes or None)``; the model's size and SHA-256 are checked."""
    hardware = detect_hardware() if hardware is None else hardware
    try:
        with NpzMembers(path) as members:
            return _read(os.fspath(path), members, hardware)
    except FileNotFoundError:
        raise PackedFormatError(f"{path}: no such file") from None
    except PackedFormatError:
        raise
    except UntrustedFileError as error:
        raise PackedFormatError(str(error)) from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as error:
        raise PackedFormatError(f"{path}: malformed metadata ({error!r})") from None


def _read(path, members: NpzMembers, hardware) -> dict:
    if _METADATA not in members.names:
        raise PackedFormatError(f"{path}: no {_METADATA} member; not written by cso.save_packed")
    raw = members.read(_METADATA, max_elements=_MAX_METADATA_BYTES)
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise PackedFormatError(f"{path}: {_METADATA} is not a byte string")
    metadata = parse_json(raw.tobytes(), what=f"{path} metadata")
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise PackedFormatError(f"{path}: not a {FORMAT} file")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise PackedFormatError(
            f"{path}: format version {metadata.get('format_version')!r} is not supported "
            f"(this cso reads version {FORMAT_VERSION}): pack the filters again"
        )
    entries = metadata["layers"]
    if not isinstance(entries, dict) or not entries:
        raise PackedFormatError(f"{path}: metadata lists no layers")
    expected = {_METADATA}
    model_entry = metadata.get("model")
    if model_entry is not None:
        expected.add(_MODEL)
    for name, entry in entries.items():
        expected.add(f"{name}/panels")
        if entry["has_bias"] is True:
            expected.add(f"{name}/bias")
    # Names first: no member is read unless a layer entry expects it.
    unexpected = sorted(set(members.names) - expected)
    if unexpected:
        raise PackedFormatError(f"{path}: members without a layer entry: {unexpected}")
    listed = _listed_kernels(path, metadata["micro_kernels"], hardware)
    layers = {
        name: _layer(path, name, entry, members, listed, hardware)
        for name, entry in entries.items()
    }
    return layers, None if model_entry is None else _model(path, model_entry, members)


def _model(path, entry, members) -> bytes:
    """The saved model's bytes, their count and SHA-256 checked against the metadata."""
    size = entry["bytes"]
    if type(size) is not int or not 0 < size <= _MAX_MODEL_BYTES:
        raise PackedFormatError(f"{path}: the model's size {size!r} is not a byte count")
    model = _member(path, members, _MODEL, "uint8", (size,)).tobytes()
    if hashlib.sha256(model).hexdigest() != entry["sha256"]:
        raise PackedFormatError(f"{path}: the saved model fails its checksum")
    return model


def _listed_kernels(path, kernels, hardware) -> set:
    """The ``(dtype, (Nf, Nwin))`` the file lists, each one this machine runs."""
    listed = set()
    for kernel in kernels:
        dtype_name = kernel["dtype"]
        if dtype_name not in ("float32", "float64"):
            raise PackedFormatError(f"{path}: micro-kernel dtype {dtype_name!r} is not supported")
        shape = (kernel["filters_per_tile"], kernel["windows_per_tile"])
        usable = tiles.micro_kernel_shapes(
            hardware.vector_bytes, hardware.vector_registers, np.dtype(dtype_name).itemsize
        )
        if shape not in usable:
            here = ", ".join(f"{nf}x{nwin}" for nf, nwin in usable)
            raise PackedFormatError(
                f"{path}: {dtype_name} panels were packed for a {shape[0]}x{shape[1]} "
                f"micro-kernel; this machine uses {here}: pack them again here"
            )
        listed.add((dtype_name, shape))
    return listed


def _layer(path, name, entry, members, listed, hardware) -> PackedFilters:
    """One layer: its plan, geometry and sizes checked before its arrays are read."""
    if not isinstance(entry, dict):
        raise PackedFormatError(f"{path}: layer {name!r} entry is not an object")
    plan = Plan.from_dict(entry["plan"])  # every field validated (plan_checks)
    if (plan.dtype, (plan.filters_per_tile, plan.windows_per_tile)) not in listed:
        raise PackedFormatError(
            f"{path}: layer {name!r} uses a micro-kernel the file does not list"
        )
    lanes = max(1, hardware.vector_bytes // np.dtype(plan.dtype).itemsize)
    if plan.vector_lanes != lanes:
        raise PackedFormatError(
            f"{path}: layer {name!r} was packed for {plan.vector_lanes}-lane vectors; this "
            f"machine has {lanes}: pack it again here"
        )
    top, bottom, left, right = entry["padding"]
    geometry = make_geometry(
        tuple(entry["input_shape"]),
        tuple(entry["w_shape"]),
        stride=tuple(entry["stride"]),
        padding=((top, bottom), (left, right)),
        dilation=tuple(entry["dilation"]),
        groups=entry["groups"],
    )
    if geometry != plan.geometry or entry["dtype"] != plan.dtype:
        raise PackedFormatError(f"{path}: layer {name!r} plan is for another convolution")
    w_shape = (
        geometry.filters,
        geometry.channels_per_group,
        geometry.kernel_height,
        geometry.kernel_width,
    )
    size = packed_elements(plan, w_shape)
    panels = _member(path, members, f"{name}/panels", plan.dtype, (size,))
    bias = None
    if entry["has_bias"] is True:
        bias_size = geometry.groups * padded_filters_per_group(
            geometry.filters, geometry.groups, bias_tile(plan)
        )
        bias = _member(path, members, f"{name}/bias", plan.dtype, (bias_size,))
    elif entry["has_bias"] is not False:
        raise PackedFormatError(f"{path}: layer {name!r} has_bias must be true or false")
    packed = PackedFilters(
        panels=_aligned_copy(panels),  # private, writeable, on a cache line
        bias=bias,
        w_shape=w_shape,
        input_shape=(geometry.batch, geometry.channels, geometry.height, geometry.width),
        stride=(geometry.stride_h, geometry.stride_w),
        padding=(geometry.pad_top, geometry.pad_bottom, geometry.pad_left, geometry.pad_right),
        dilation=(geometry.dilation_h, geometry.dilation_w),
        groups=geometry.groups,
        plan=plan,
    )
    described = {key: value for key, value in entry.items() if key != "sha256"}
    if checksum(described, packed.panels, packed.bias) != entry["sha256"]:
        raise PackedFormatError(
            f"{path}: layer {name!r} fails its checksum: the file is damaged or was edited"
        )
    return packed


def _member(path, members, member, dtype_name, shape) -> np.ndarray:
    """Member ``member``, its header checked against ``dtype_name`` and ``shape`` first."""
    if member not in members.names:
        raise PackedFormatError(f"{path}: no member {member!r}")
    dtype, stored_shape, _ = members.header(member)
    if dtype != np.dtype(dtype_name) or stored_shape != shape:
        raise PackedFormatError(
            f"{path}: member {member!r} is {dtype} {stored_shape}, expected {dtype_name} {shape}"
        )
    return members.read(member, max_elements=int(np.prod(shape)))


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A writeable copy of 1-D ``array`` starting on a 64-byte boundary, as
    the micro-kernels' vector loads of panel rows want it."""
    copy = aligned_empty(array.size, array.dtype)
    copy[:] = array
    return copy
