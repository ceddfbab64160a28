"""Specialised kernels, generated once per key and memoised.

A specialisation is keyed by ``(Nf, Nwin, dtype, vector lanes, vector
operand)``.  For each
key this module writes a real file: the macro-kernel template
(:mod:`cso.macrokernel.loops`) followed by one line binding its
``microkernel`` to the generated outer-product intrinsic.  The file's name
carries the key and a hash of every source it depends on, so:

* each specialisation has its own Numba on-disk cache (Numba keys a cache by
  source file, not by the globals a function froze: two shapes sharing one
  file would serve each other's machine code, DESIGN.md section 3);
* a change to any of those sources, or to the Numba version, gives new
  files, never a stale kernel.

The directory is ``$CSO_CACHE_DIR``, else ``~/.cache/cso``; when neither is
writable a per-process temporary directory is used (no reuse across runs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import sys
import threading

import numba

from ..cachedir import cache_directory
from ..macrokernel import bounds as _bounds_module
from ..macrokernel import loops as _loops_module
from ..packing import filters as _filters_module
from ..packing import inputs as _inputs_module
from ..packing import transpose as _transpose_module
from ..packing import vector_copy as _vector_copy_module
from . import outer_product as _outer_product_module
from .outer_product import VECTOR_OPERANDS

_lock = threading.Lock()
_modules: dict = {}

_DEPENDENCIES = (
    _loops_module,
    _bounds_module,
    _filters_module,
    _inputs_module,
    _transpose_module,
    _vector_copy_module,
    _outer_product_module,
)


def _source_hash() -> str:
    digest = hashlib.sha256(numba.__version__.encode())
    for module in _DEPENDENCIES:
        digest.update(pathlib.Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


# Measurement variants (for the benchmark's time breakdown only): the same
# loop nests with a stage replaced by a no-op, so that the time of a stage is
# the difference between the full program and the one without it.
_VARIANTS = {
    None: "",
    "no-kernel": ("\n@njit(nogil=True)\ndef microkernel(*args):\n    return\n"),
    # The panels then hold what earlier calls packed into the kept workspace
    # (zeros at first): finite operands, see cso.workspace.
    "no-pack": (
        "\n@njit(nogil=True)\ndef _pack_tile(*args):\n    return\n"
        "\n@njit(nogil=True)\ndef _pack_block(*args):\n    return\n"
    ),
}
_VARIANTS["skeleton"] = _VARIANTS["no-kernel"] + _VARIANTS["no-pack"]
# The micro-kernel without its software prefetch (see _module_source).
_VARIANTS["no-prefetch"] = ""
# A filter-vectorised tile written back one element at a time (see _module_source).
_VARIANTS["element-stores"] = ""
# 1x1 panels packed tile by tile, as other layers are, not channel by channel.
_VARIANTS["tile-by-tile"] = (
    '\n@njit(nogil=True, inline="always")\n'
    "def _pack_block(operands, b, image, group, c0, channels, first_tile, tiles, size):\n"
    "    for t in range(tiles):\n"
    "        start = (first_tile + t) * b.windows_per_tile\n"
    "        _pack_tile(operands, b, image, group, c0, channels, start, t * size)\n"
)
# The per-tile helpers called as functions rather than inlined into the loops.
_VARIANTS["outlined"] = (
    "\n_tile = njit(nogil=True)(_tile.py_func)\n_pack_tile = njit(nogil=True)(_pack_tile.py_func)\n"
)


def _module_source(
    filters_per_tile, windows_per_tile, dtype_name, vector_lanes, variant, vector_operand
) -> str:
    template = pathlib.Path(_loops_module.__file__).read_text()
    # The builder's keyword for each variant that changes the micro-kernel itself.
    kernel_options = {
        "no-prefetch": ", prefetch_distance=0",
        "element-stores": ", transposed_store=False",
    }
    binding = (
        "\n\n# ---- specialisation written by cso.microkernels.registry ----\n"
        "from cso.microkernels.outer_product import build_outer_product_kernel\n"
        f"microkernel = build_outer_product_kernel({filters_per_tile}, {windows_per_tile}, "
        f"{dtype_name!r}, {vector_lanes}, {vector_operand!r}{kernel_options.get(variant, '')})\n"
    )
    return template + binding + _VARIANTS[variant]


def loop_module(
    filters_per_tile: int,
    windows_per_tile: int,
    dtype_name: str,
    vector_lanes: int,
    variant=None,
    vector_operand: str = "windows",
):
    """The macro-kernel module specialised for one micro-kernel, memoised by its key.

    Parameters
    ----------
    filters_per_tile, windows_per_tile, dtype_name, vector_lanes
        The micro-kernel: ``Nf x Nwin`` of ``dtype_name`` with vectors of
        ``vector_lanes`` elements.
    variant : {None, "no-kernel", "no-pack", "skeleton", "no-prefetch", "outlined", \
"tile-by-tile", "element-stores"}
        None for the real thing; the next three drop the micro-kernel, the
        input packing, or both, to time the rest (see ``python -m cso bench
        --breakdown``), and their results are meaningless; "no-prefetch" is
        the real thing without the micro-kernel's software prefetch, and
        "outlined" without the per-tile helpers inlined into the loops, and
        "tile-by-tile" packs 1x1 panels one tile at a time, not channel by
        channel, and "element-stores" writes a filter-vectorised tile back
        one element at a time, not transposed in registers
        (``python experiments/variants.py``).
    vector_operand : {"windows", "filters"}
        The micro-kernel's vector dimension
        (:func:`~cso.microkernels.outer_product.build_outer_product_kernel`).

    Returns
    -------
    module
        With ``convolve_input_stationary`` and ``convolve_weight_stationary``
        bound to the ``Nf x Nwin`` micro-kernel for ``dtype_name``.
    """
    if variant not in _VARIANTS:
        raise ValueError(f"variant must be one of {sorted(map(str, _VARIANTS))}, got {variant!r}")
    if vector_operand not in VECTOR_OPERANDS:
        raise ValueError(
            f"vector_operand must be one of {', '.join(VECTOR_OPERANDS)}, got {vector_operand!r}"
        )
    key = (
        int(filters_per_tile),
        int(windows_per_tile),
        str(dtype_name),
        int(vector_lanes),
        variant,
        str(vector_operand),
    )
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return module
        suffix = "" if variant is None else "_" + variant.replace("-", "_")
        orientation = {"windows": "", "filters": "_fvec", "reduction": "_dot"}[vector_operand]
        name = (
            f"cso_loops_f{key[0]}_w{key[1]}_{key[2]}_l{key[3]}{orientation}{suffix}"
            f"_{_source_hash()}"
        )
        path = cache_directory() / f"{name}.py"
        source = _module_source(*key)
        if not path.exists() or path.read_text() != source:
            # Write then rename, so that a concurrent process never imports half a file.
            temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            temporary.write_text(source)
            os.replace(temporary, path)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[key] = module
        return module
