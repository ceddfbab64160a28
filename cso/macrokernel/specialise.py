"""Specialised loop nests: the macro-kernel bound to one micro-kernel, memoised.

A specialisation is keyed by ``(Nf, Nwin, dtype, vector lanes, vector
operand)``.  For each
key this module writes a real file: the macro-kernel template
(:mod:`.loops`) followed by one line binding its
``microkernel`` to the generated outer-product intrinsic.  The file's name
carries the key and a hash of every source it depends on, so:

* each specialisation has its own Numba on-disk cache (Numba keys a cache by
  source file, not by the globals a function froze: two shapes sharing one
  file would serve each other's machine code, DESIGN.md section 3);
* a change to any of those sources, or to the Numba version, gives new
  files, never a stale kernel.

A module serves every thread count: its nests are plain functions of one
worker's share, which :mod:`.workers` runs on the calling thread for a
one-thread plan and through one shared parallel loop otherwise.

The directory is ``$CSO_CACHE_DIR``, else ``~/.cache/cso``; when neither is
writable a per-process temporary directory is used (no reuse across runs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import sys
import threading
from typing import NamedTuple

import numba

from ..analysis import choices as choices_source
from ..analysis import hardware as hardware_source
from ..analysis import plane_shapes as plane_shapes_source
from ..analysis import planes as plane_analysis_source
from ..analysis import rows as row_analysis_source
from ..analysis import tap_layout as tap_layout_source
from ..analysis.choices import VectorOperand
from ..analysis.hardware import KERNEL_PREFETCH_DISTANCE
from ..cachedir import cache_directory, write_text_atomically
from ..microkernels import activations as activations_source
from ..microkernels import dot_products as dot_products_source
from ..microkernels import epilogue as epilogue_source
from ..microkernels import lane_taps as lane_taps_source
from ..microkernels import lane_transposes as lane_transposes_source
from ..microkernels import outer_product as outer_product_source
from ..microkernels import outer_product_emitter as outer_product_emitter_source
from ..microkernels import plane_taps as plane_taps_source
from ..microkernels import row_taps as row_taps_source
from ..microkernels.row_taps import masked_fma_vectors
from ..microkernels import taps as taps_source
from ..microkernels import tile_stores as tile_stores_source
from ..microkernels import vector_ir as vector_ir_source
from ..microkernels.vector_ir import target_has_mask_registers
from ..microkernels import whole_plane_taps as whole_plane_taps_source
from ..packing import depthwise as depthwise_packing_source
from ..packing import filters as filters_source
from ..packing import inputs as inputs_source
from ..packing import transpose as transpose_source
from ..packing import run_stores as run_stores_source
from ..packing import vector_copy as vector_copy_source
from . import bounds as bounds_source
from .bounds import ROW_PLANE_END, ROW_PLANE_START
from . import depthwise as depthwise_source
from . import input_tiles as input_tiles_source
from . import lanes as lanes_source
from . import loops as loops_source
from . import nest_indexing as nest_indexing_source
from . import planes as planes_source
from . import rows as rows_source

_lock = threading.Lock()
_modules: dict = {}

# Every source a generated module is built from: its name hashes them all.
HASHED_SOURCES = (
    loops_source,
    input_tiles_source,
    nest_indexing_source,
    bounds_source,
    filters_source,
    inputs_source,
    transpose_source,
    vector_copy_source,
    run_stores_source,
    outer_product_source,
    outer_product_emitter_source,
    tile_stores_source,
    dot_products_source,
    depthwise_source,
    depthwise_packing_source,
    taps_source,
    lanes_source,
    lane_taps_source,
    lane_transposes_source,
    planes_source,
    plane_taps_source,
    whole_plane_taps_source,
    plane_analysis_source,
    plane_shapes_source,
    rows_source,
    row_taps_source,
    row_analysis_source,
    tap_layout_source,
    hardware_source,
    epilogue_source,
    vector_ir_source,
    activations_source,
    choices_source,
)


def source_hash() -> str:
    """The hash of every source a generated module is built from, and Numba's version."""
    digest = hashlib.sha256(numba.__version__.encode())
    for module in HASHED_SOURCES:
        digest.update(pathlib.Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


class LoopPatch(NamedTuple):
    """A change to a generated loop module, for measurement only.

    ``source`` is appended to the module's text (it may rebind any of the
    template's helpers, e.g. a no-op ``microkernel``), and
    ``kernel_options`` are keywords for
    :func:`~cso.microkernels.outer_product.build_outer_product_kernel`.
    The production path never passes one; :mod:`cso.measure` names the
    patches it times.
    """

    name: str
    source: str = ""
    kernel_options: tuple = ()


def _module_source(key, patch) -> str:
    filters_per_tile, windows_per_tile, dtype_name, vector_lanes, vector_operand, distance = key
    template = pathlib.Path(loops_source.__file__).read_text()
    # A measurement variant's kernel options take precedence (no-prefetch).
    chosen = {"prefetch_distance": distance, **dict(patch.kernel_options if patch else ())}
    options = "".join(f", {k}={v!r}" for k, v in chosen.items())
    binding = (
        "\n\n# ---- specialisation written by cso.macrokernel.specialise ----\n"
        "from cso.microkernels.outer_product import build_outer_product_kernel\n"
        f"microkernel = build_outer_product_kernel({filters_per_tile}, {windows_per_tile}, "
        f"{dtype_name!r}, {vector_lanes}, {str(vector_operand)!r}{options})\n"
        f"VECTOR_TOKEN = (None,) * {vector_lanes}\n"
        "from cso.microkernels.epilogue import build_epilogue_run\n"
        f"epilogue_run = build_epilogue_run({dtype_name!r}, {vector_lanes})\n"
    )
    return template + binding + (patch.source if patch else "")


def loop_module(
    filters_per_tile: int,
    windows_per_tile: int,
    dtype_name: str,
    vector_lanes: int,
    vector_operand: str = "windows",
    patch: LoopPatch = None,
    prefetch_distance: int = KERNEL_PREFETCH_DISTANCE,
):
    """The macro-kernel module specialised for one micro-kernel, memoised by its key.

    Parameters
    ----------
    filters_per_tile, windows_per_tile, dtype_name, vector_lanes
        The micro-kernel: ``Nf x Nwin`` of ``dtype_name`` with vectors of
        ``vector_lanes`` elements.
    vector_operand : {"windows", "filters", "reduction"}
        The micro-kernel's vector dimension
        (:func:`~cso.microkernels.outer_product.build_outer_product_kernel`).
    patch : LoopPatch, optional
        A measurement variant of the module (see :class:`LoopPatch`); None
        for the real thing.
    prefetch_distance : int
        The micro-kernel's software prefetch, reduction steps ahead (0: none;
        ``Hardware.kernel_prefetch_distance``).

    Returns
    -------
    module
        With ``convolve_input_stationary`` and ``convolve_weight_stationary``
        bound to the ``Nf x Nwin`` micro-kernel for ``dtype_name``.
    """
    _check_patch(patch, kernel_options=True)
    key = (
        int(filters_per_tile),
        int(windows_per_tile),
        str(dtype_name),
        int(vector_lanes),
        VectorOperand(vector_operand),
        int(prefetch_distance),
    )
    orientation = {"windows": "", "filters": "_fvec", "reduction": "_dot"}[key[4].value]
    distance = "" if key[5] == KERNEL_PREFETCH_DISTANCE else f"_p{key[5]}"
    name = f"cso_loops_f{key[0]}_w{key[1]}_{key[2]}_l{key[3]}{orientation}{distance}"
    name += _patch_suffix(patch)
    return _specialised((key, patch), name, lambda: _module_source(key, patch))


def depthwise_module(
    kernel_height: int,
    stride_h: int,
    dilation_h: int,
    rows: int,
    vectors: int,
    dtype_name: str,
    vector_lanes: int,
    masked_rows: int = 0,
    filters: int = 1,
    patch: LoopPatch = None,
):
    """The depthwise loop nest (:mod:`.depthwise`) bound to the tap kernel of
    ``rows x vectors`` accumulators for filters ``kernel_height`` high at
    ``stride_h`` and ``dilation_h`` down, of ``vector_lanes`` ``dtype_name``
    elements, its last ``masked_rows`` rows' stores masked
    (:func:`~cso.microkernels.taps.build_tap_kernel`), ``filters`` filters
    a call, memoised; ``patch``: a measurement variant (:class:`LoopPatch`:
    its source rebinding ``tap_kernel`` or ``pack_channel_phases``), None for
    the real thing."""
    shape = tuple(int(n) for n in (kernel_height, stride_h, dilation_h, rows, vectors))
    arguments = ", ".join(str(n) for n in shape)
    binding = (
        "from cso.microkernels.taps import build_tap_kernel\n"
        f"tap_kernel = build_tap_kernel({arguments}, {dtype_name!r}, {int(vector_lanes)}, "
        f"{int(masked_rows)}, {int(filters)})\n"
        f"VECTOR_TOKEN = (None,) * {int(vector_lanes)}\n"
    )
    name = "cso_depthwise_r{}_s{}_d{}_b{}_v{}".format(*shape)
    name += f"_{dtype_name}_l{int(vector_lanes)}" + (f"_m{int(masked_rows)}" if masked_rows else "")
    name += f"_f{int(filters)}" if filters > 1 else ""
    key = ("depthwise",) + shape + (str(dtype_name), int(vector_lanes), int(masked_rows))
    key += (int(filters),)
    return _family_module(key, name, depthwise_source, binding, patch)


def lanes_module(
    kernel_width: int, stride_w: int, dilation_w: int, outputs: int, dtype_name: str,
    vector_lanes: int, patch: LoopPatch = None,
):  # fmt: skip
    """The lane loop nest (:mod:`.lanes`) bound to the lane tap kernel of
    ``outputs`` pixels for filters ``kernel_width`` wide at ``stride_w`` and
    ``dilation_w`` across, and to the pixel-vector packing of
    ``vector_lanes`` ``dtype_name`` lanes
    (:mod:`cso.microkernels.lane_taps`, :mod:`cso.microkernels.lane_transposes`), memoised;
    ``patch``: a measurement variant (:class:`LoopPatch`: its source rebinding
    ``lane_tap_kernel``, ``lane_pack`` or ``lane_unpack``), None for the
    real thing."""
    shape = tuple(int(n) for n in (kernel_width, stride_w, dilation_w, outputs))
    arguments = ", ".join(str(n) for n in shape)
    kind = f"{dtype_name!r}, {int(vector_lanes)}"
    binding = (
        "from cso.microkernels.lane_taps import build_lane_tap_kernel\n"
        "from cso.microkernels.lane_transposes import build_lane_pack, build_lane_unpack\n"
        f"lane_tap_kernel = build_lane_tap_kernel({arguments}, {kind})\n"
        f"lane_pack = build_lane_pack({kind})\n"
        f"lane_unpack = build_lane_unpack({kind})\n"
        f"LANES = {int(vector_lanes)}\n"
    )
    name = "cso_lanes_s{}_sw{}_dw{}_o{}".format(*shape) + f"_{dtype_name}_l{int(vector_lanes)}"
    key = ("lanes",) + shape + (str(dtype_name), int(vector_lanes))
    return _family_module(key, name, lanes_source, binding, patch)


def planes_module(
    kernel_height: int, kernel_width: int, dilation_h: int, dilation_w: int, vectors: int,
    dtype_name: str, vector_lanes: int, tail_lanes: int = 0, patch: LoopPatch = None,
    whole_plane: tuple = None,
):  # fmt: skip
    """The plane loop nest (:mod:`.planes`) bound to the plane tap kernels of
    ``vectors`` output vectors for ``kernel_height x kernel_width`` filters
    at ``dilation_h, dilation_w``, of ``vector_lanes`` ``dtype_name`` lanes,
    unchecked, checked with whole loads (a plane's last vector storing
    ``tail_lanes``) and checked with masked ones
    (:mod:`cso.microkernels.plane_taps`), memoised; where a call computes a
    whole plane, ``whole_plane`` (:func:`cso.analysis.planes.plane_key`)
    binds the whole-load one to the kernel built for those planes
    (:mod:`cso.microkernels.whole_plane_taps`).  ``patch``: a measurement
    variant (:class:`LoopPatch`: its source rebinding the kernels), None for
    the real thing."""
    shape = tuple(int(n) for n in (kernel_height, kernel_width, dilation_h, dilation_w, vectors))
    arguments = ", ".join(str(n) for n in shape)
    kind = f"{dtype_name!r}, {int(vector_lanes)}"
    tail_lanes = int(tail_lanes)
    unchecked = f"build_plane_tap_kernel({arguments}, False, {kind})"
    if whole_plane is None:
        edges = f"build_plane_tap_kernel({arguments}, True, {kind}, True, {tail_lanes})"
    else:
        # The nest's whole-plane path takes no unchecked table call: that name is
        # bound to the same kernel rather than built.
        whole_plane = tuple(int(n) for n in whole_plane)
        edges = unchecked = f"build_whole_plane_kernel({whole_plane!r}, {kind})"
    binding = (
        "from cso.microkernels.plane_taps import build_plane_tap_kernel\n"
        "from cso.microkernels.whole_plane_taps import build_whole_plane_kernel\n"
        f"plane_tap_kernel = {unchecked}\n"
        f"plane_tap_kernel_edges = {edges}\n"
        f"plane_tap_kernel_checked = build_plane_tap_kernel({arguments}, True, {kind})\n"
        f"LANES = {int(vector_lanes)}\n"
        f"WHOLE_PLANE = {whole_plane is not None}\n"
    )
    name = "cso_planes_r{}_s{}_dh{}_dw{}_u{}".format(*shape) + f"_{dtype_name}_l{int(vector_lanes)}"
    name += f"_t{tail_lanes}"
    if whole_plane is not None:
        name += "_plane" + "_".join(str(n) for n in whole_plane[4:])
    key = ("planes",) + shape + (str(dtype_name), int(vector_lanes), tail_lanes, whole_plane)
    return _family_module(key, name, planes_source, binding, patch)


def rows_module(
    kernel_height: int, kernel_width: int, dilation_h: int, dilation_w: int, stride_h: int,
    stride_w: int, rows: int, vectors: int, dtype_name: str, vector_lanes: int,
    plane: tuple, unmasked_inner: bool = False, tail_lanes: int = 0, patch: LoopPatch = None,
    masked_fmas: bool = None,
):  # fmt: skip
    """The row loop nest (:mod:`.rows`) for planes of geometry ``plane`` (the
    :class:`~cso.macrokernel.bounds.RowBounds` fields from ``height`` to
    ``window_rows``, constants of the module; None: read from the bounds,
    for a measurement) bound to the row tap kernel of
    ``rows x vectors`` output vectors for ``kernel_height x kernel_width``
    filters at ``dilation_h, dilation_w`` and strides ``stride_h, stride_w``,
    of ``vector_lanes`` ``dtype_name`` lanes (:mod:`cso.microkernels.row_taps`),
    its inner vectors unmasked when ``unmasked_inner``, its whole-load kernel
    storing ``tail_lanes`` of a row's last vector (0: all), its masked
    columns' FMAs under mask registers when ``masked_fmas`` (None: where
    the target has them,
    :func:`~cso.microkernels.vector_ir.target_has_mask_registers`), memoised;
    ``patch``: a measurement variant (:class:`LoopPatch`: its source
    rebinding the kernel), None for the real thing."""
    shape = tuple(
        int(n)
        for n in (
            kernel_height, kernel_width, dilation_h, dilation_w, stride_h, stride_w, rows,
            vectors,
        )
    )  # fmt: skip
    unmasked_inner = bool(unmasked_inner)
    arguments = ", ".join(str(n) for n in shape)
    tail_lanes = int(tail_lanes)
    if masked_fmas is None:
        # Masked FMAs where the target has AVX-512's mask registers (row_taps).
        masked_fmas = masked_fma_vectors(dtype_name, vector_lanes) and target_has_mask_registers()
    masked_fmas = bool(masked_fmas)
    plane = None if plane is None else tuple(int(n) for n in plane)
    if plane is not None and len(plane) != ROW_PLANE_END - ROW_PLANE_START:
        fields = ROW_PLANE_END - ROW_PLANE_START
        raise ValueError(f"plane must hold the {fields} plane fields, got {plane}")
    binding = (
        "from cso.microkernels.row_taps import build_row_tap_kernel\n"
        f"row_tap_kernel = build_row_tap_kernel({arguments}, {dtype_name!r}, "
        f"{int(vector_lanes)}, {unmasked_inner}, True, {tail_lanes}, {masked_fmas})\n"
        f"row_tap_kernel_checked = build_row_tap_kernel({arguments}, {dtype_name!r}, "
        f"{int(vector_lanes)}, {unmasked_inner}, masked_fmas={masked_fmas})\n"
        f"ROWS = {int(rows)}\n"
        f"LANES = {int(vector_lanes)}\n"
        f"PLANE = {plane!r}\n"
    )
    name = "cso_rows_r{}_s{}_dh{}_dw{}_sh{}_sw{}_b{}_u{}".format(*shape)
    if plane is not None:
        # The plane's size and padding, and a digest of all its fields.
        digest = hashlib.sha1(repr(plane).encode()).hexdigest()[:8]
        name += "_h{}w{}t{}l{}".format(*plane[:2], *plane[6:8]) + f"_{digest}"
    name += f"_{dtype_name}_l{int(vector_lanes)}" + ("_inner" if unmasked_inner else "")
    name += f"_t{tail_lanes}" + ("_kfma" if masked_fmas else "")
    key = ("rows",) + shape + (
        str(dtype_name), int(vector_lanes), unmasked_inner, tail_lanes, masked_fmas, plane
    )  # fmt: skip
    return _family_module(key, name, rows_source, binding, patch)


def _family_module(key, name, template, binding, patch):
    """A depthwise family's loop module: its nest ``template`` (a module whose
    file is the template) followed by ``binding`` (the lines binding the
    template's kernels for ``key``) and ``patch``'s source, memoised by
    ``key`` and ``patch`` (:func:`_specialised`)."""
    _check_patch(patch)

    def source():
        return (
            pathlib.Path(template.__file__).read_text()
            + "\n\n# ---- specialisation written by cso.macrokernel.specialise ----\n"
            + binding
            + (patch.source if patch else "")
        )

    return _specialised(key + (patch,), name + _patch_suffix(patch), source)


def _check_patch(patch, kernel_options: bool = False) -> None:
    if patch is not None and not isinstance(patch, LoopPatch):
        raise TypeError(f"patch must be a LoopPatch or None, got {type(patch).__name__}")
    if patch is not None and patch.kernel_options and not kernel_options:
        raise ValueError(
            f"patch {patch.name!r} has kernel options: only the dense loop module's "
            "outer-product kernel takes them"
        )


def _patch_suffix(patch) -> str:
    """What a measurement variant adds to its module's name (and cache)."""
    return "" if patch is None else "_" + patch.name.replace("-", "_")


def _specialised(key, name, source_of):
    """The module ``name`` (plus the sources' hash) written from ``source_of()``
    and imported, memoised by ``key``."""
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return module
        name = f"{name}_{source_hash()}"
        path = cache_directory() / f"{name}.py"
        source = source_of()
        if not path.exists() or path.read_text() != source:
            # Write then rename, so that a concurrent process never imports half a file.
            write_text_atomically(path, source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[key] = module
        return module
