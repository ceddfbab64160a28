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
one-thread plan and through one shared launch otherwise.  The depthwise
families' modules are made the same way (:func:`specialised_module`), by
:mod:`.family_modules`.

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
from ..numba_cache import guard_module
from ..microkernels import activations as activations_source
from ..microkernels import dot_products as dot_products_source
from ..microkernels import epilogue as epilogue_source
from ..microkernels import lane_taps as lane_taps_source
from ..microkernels import lane_transposes as lane_transposes_source
from ..microkernels import outer_product as outer_product_source
from ..microkernels import outer_product_emitter as outer_product_emitter_source
from ..microkernels import plane_taps as plane_taps_source
from ..microkernels import row_picks as row_picks_source
from ..microkernels import row_taps as row_taps_source
from ..microkernels import taps as taps_source
from ..microkernels import tile_stores as tile_stores_source
from ..microkernels import vector_ir as vector_ir_source
from ..microkernels import whole_plane_taps as whole_plane_taps_source
from ..packing import depthwise as depthwise_packing_source
from ..packing import filters as filters_source
from ..packing import inputs as inputs_source
from ..packing import transpose as transpose_source
from ..packing import run_stores as run_stores_source
from ..packing import vector_copy as vector_copy_source
from . import bounds as bounds_source
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
    row_picks_source,
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
    check_patch(patch, kernel_options=True)
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
    name += patch_suffix(patch)
    return specialised_module((key, patch), name, lambda: _module_source(key, patch))


def check_patch(patch, kernel_options: bool = False) -> None:
    if patch is not None and not isinstance(patch, LoopPatch):
        raise TypeError(f"patch must be a LoopPatch or None, got {type(patch).__name__}")
    if patch is not None and patch.kernel_options and not kernel_options:
        raise ValueError(
            f"patch {patch.name!r} has kernel options: only the dense loop module's "
            "outer-product kernel takes them"
        )


def patch_suffix(patch) -> str:
    """What a measurement variant adds to its module's name (and cache)."""
    return "" if patch is None else "_" + patch.name.replace("-", "_")


def specialised_module(key, name, source_of):
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
        # Its nests compile for each dtype, in whichever processes come first.
        guard_module(module)
        _modules[key] = module
        return module
