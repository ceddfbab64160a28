"""The depthwise families' specialised loop modules: each family's nest
template (:mod:`.depthwise`, :mod:`.lanes`, :mod:`.planes`, :mod:`.rows`)
bound to the kernels generated for one key, written and imported as
:mod:`.specialise` does the dense nests' (one file, one Numba cache, a
name carrying the key and the sources' hash).

The row and lane nests are also keyed by their planes' geometry (the
fields of their bounds from the input's height on,
:data:`~cso.macrokernel.bounds.ROW_PLANE_START`,
:data:`~cso.macrokernel.bounds.LANE_PLANE_START`), bound as the module's
``PLANE`` constant: LLVM folds each block's addresses, masks and loop
bounds into its code (``experiments/row_plane_constants.py``).  A module a
plane costs its compilation once a machine (about a second; the disk cache
serves it after).
"""

from __future__ import annotations

import hashlib
import inspect
import pathlib

from ..analysis.rows import block_starts
from ..microkernels.row_taps import masked_fma_vectors
from ..microkernels.vector_ir import target_has_mask_registers
from . import depthwise as depthwise_source
from . import lanes as lanes_source
from . import planes as planes_source
from . import rows as rows_source
from . import winograd as winograd_source
from .bounds import LANE_PLANE_END, LANE_PLANE_START, ROW_PLANE_END, ROW_PLANE_START, RowBounds
from .specialise import LoopPatch, check_patch, patch_suffix, specialised_module


# The output's height in a row plan's plane fields.
ROW_OUT_HEIGHT = RowBounds._fields.index("out_height") - ROW_PLANE_START


def plane_constants(plane, start: int, end: int) -> tuple:
    """``(plane, name suffix)``: ``plane`` (a family's plane fields,
    ``bounds[start:end]``) as ints, or None, checked to hold ``end -
    start`` of them; the suffix names the input's height and width and a
    digest of every field ("" for None)."""
    if plane is None:
        return None, ""
    plane = tuple(int(n) for n in plane)
    if len(plane) != end - start:
        raise ValueError(f"plane must hold the {end - start} plane fields, got {plane}")
    digest = hashlib.sha1(repr(plane).encode()).hexdigest()[:8]
    return plane, f"_h{plane[0]}w{plane[1]}_{digest}"


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
    vector_lanes: int, plane: tuple, patch: LoopPatch = None,
):  # fmt: skip
    """The lane loop nest (:mod:`.lanes`) for planes of geometry ``plane`` (the
    :class:`~cso.macrokernel.bounds.LaneBounds` fields from ``height`` on,
    constants of the module; None: read from the bounds, for a measurement)
    bound to the lane tap kernel of
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
    plane, plane_name = plane_constants(plane, LANE_PLANE_START, LANE_PLANE_END)
    binding = (
        "from cso.microkernels.lane_taps import build_lane_tap_kernel\n"
        "from cso.microkernels.lane_transposes import build_lane_pack, build_lane_unpack\n"
        f"lane_tap_kernel = build_lane_tap_kernel({arguments}, {kind})\n"
        f"lane_pack = build_lane_pack({kind})\n"
        f"lane_unpack = build_lane_unpack({kind})\n"
        f"LANES = {int(vector_lanes)}\n"
        f"PLANE = {plane!r}\n"
    )
    name = "cso_lanes_s{}_sw{}_dw{}_o{}".format(*shape) + plane_name
    name += f"_{dtype_name}_l{int(vector_lanes)}"
    key = ("lanes",) + shape + (str(dtype_name), int(vector_lanes), plane)
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


def winograd_module(
    filters_per_tile: int, windows_per_tile: int, dtype_name: str, vector_lanes: int,
    prefetch_distance: int, patch: LoopPatch = None,
):  # fmt: skip
    """The Winograd loop nest (:mod:`.winograd`) bound to the outer-product
    kernel of ``filters_per_tile x windows_per_tile`` (tiles in its vectors,
    prefetching ``prefetch_distance`` steps ahead) and to the transforms of
    ``vector_lanes`` ``dtype_name`` lanes
    (:mod:`cso.microkernels.winograd_transforms`), memoised; ``patch``: a
    measurement variant (:class:`LoopPatch`: its source rebinding
    ``microkernel`` or a transform), None for the real thing."""
    shape = tuple(int(n) for n in (filters_per_tile, windows_per_tile))
    kind = f"{dtype_name!r}, {int(vector_lanes)}"
    binding = (
        "from cso.microkernels.outer_product import build_outer_product_kernel\n"
        "from cso.microkernels.winograd_transforms import (\n"
        "    build_filter_tiles, build_input_tiles, build_output_tiles,\n"
        ")\n"
        f"microkernel = build_outer_product_kernel({shape[0]}, {shape[1]}, {kind}, 'windows', "
        f"{int(prefetch_distance)})\n"
        f"input_tiles = build_input_tiles({kind})\n"
        f"output_tiles = build_output_tiles({kind})\n"
        f"filter_tiles = build_filter_tiles({kind})\n"
        f"LANES = {int(vector_lanes)}\n"
        f"FILTERS_PER_TILE = {shape[0]}\n"
        f"WINDOWS_PER_TILE = {shape[1]}\n"
    )
    name = "cso_winograd_{}x{}".format(*shape) + f"_{dtype_name}_l{int(vector_lanes)}"
    name += f"_p{int(prefetch_distance)}"
    key = ("winograd",) + shape + (str(dtype_name), int(vector_lanes), int(prefetch_distance))
    return _family_module(key, name, winograd_source, binding, patch)


def rows_module(
    kernel_height: int, kernel_width: int, dilation_h: int, dilation_w: int, stride_h: int,
    stride_w: int, rows: int, vectors: int, dtype_name: str, vector_lanes: int,
    plane: tuple, unmasked_inner: bool = False, tail_lanes: int = 0, patch: LoopPatch = None,
    masked_fmas: bool = None, filters: int = 1,
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
    :func:`~cso.microkernels.vector_ir.target_has_mask_registers`), ``filters``
    side by side in each vector (then both kernels load under masks), memoised;
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
    filters = int(filters)
    # Filters side by side load under masks only: both kernels are the masked one.
    whole_loads = filters == 1
    tail_lanes = tail_lanes if whole_loads else 0
    plane, plane_name = plane_constants(plane, ROW_PLANE_START, ROW_PLANE_END)
    binding = (
        "from cso.microkernels.row_taps import build_row_tap_kernel\n"
        f"row_tap_kernel = build_row_tap_kernel({arguments}, {dtype_name!r}, "
        f"{int(vector_lanes)}, {unmasked_inner}, {whole_loads}, {tail_lanes}, {masked_fmas}, "
        f"{filters})\n"
        f"row_tap_kernel_checked = build_row_tap_kernel({arguments}, {dtype_name!r}, "
        f"{int(vector_lanes)}, {unmasked_inner}, masked_fmas={masked_fmas}, "
        f"filters_per_vector={filters})\n"
        f"ROWS = {int(rows)}\n"
        f"LANES = {int(vector_lanes)}\n"
        f"PLANE = {plane!r}\n"
        + _row_blocks_binding(plane, int(rows))
    )
    name = "cso_rows_r{}_s{}_dh{}_dw{}_sh{}_sw{}_b{}_u{}".format(*shape) + plane_name
    name += f"_{dtype_name}_l{int(vector_lanes)}" + ("_inner" if unmasked_inner else "")
    name += f"_t{tail_lanes}" + ("_kfma" if masked_fmas else "") + f"_f{filters}"
    key = ("rows",) + shape + (
        str(dtype_name), int(vector_lanes), unmasked_inner, tail_lanes, masked_fmas, plane,
        filters,
    )  # fmt: skip
    return _family_module(key, name, rows_source, binding, patch)


# The most blocks a plane's rows are written out in (MAX_UNROLLED_BLOCKS):
# 14-row planes (2 blocks) and 28-row ones (4) at 7 rows a block.  On a
# Xeon (Sapphire Rapids), one thread, the row nest alone and warm, blocks
# written out against the loop: dw 5x5 672 @14 38.3 against 42.2 ns a block,
# 5x5 240 @28 70.6 against 73.6 (two vectors a row).
MAX_UNROLLED_BLOCKS = 4


def _row_blocks_binding(plane, rows: int) -> str:
    """The row module's ``row_blocks``: for a plane of constant geometry and
    at most :data:`MAX_UNROLLED_BLOCKS` blocks, a function calling
    ``row_block`` at each block's first row, each a constant LLVM folds the
    block's zero rows and bounds with; else the template's loop."""
    if plane is None:
        return "row_blocks = loop_row_blocks\n"
    starts = block_starts(plane[ROW_OUT_HEIGHT], rows)
    if len(starts) > MAX_UNROLLED_BLOCKS:
        return "row_blocks = loop_row_blocks\n"
    # The template's loop takes the same arguments.
    arguments = ", ".join(inspect.signature(rows_source.loop_row_blocks.py_func).parameters)
    calls = "".join(f"    row_block({start}, {arguments})\n" for start in starts)
    return f'\n@njit(nogil=True, inline="always")\ndef row_blocks({arguments}):\n{calls}'


def _family_module(key, name, template, binding, patch):
    """A depthwise family's loop module: its nest ``template`` (a module whose
    file is the template) followed by ``binding`` (the lines binding the
    template's kernels for ``key``) and ``patch``'s source, memoised by
    ``key`` and ``patch`` (:func:`~.specialise.specialised_module`)."""
    check_patch(patch)

    def source():
        return (
            pathlib.Path(template.__file__).read_text()
            + "\n\n# ---- specialisation written by cso.macrokernel.specialise ----\n"
            + binding
            + (patch.source if patch else "")
        )

    return specialised_module(key + (patch,), name + patch_suffix(patch), source)
