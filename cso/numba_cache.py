"""Numba's disk cache, made safe for processes that compile at once.

Numba saves a cached function's overload by reading its index, picking the
first data file number the index does not use, writing the index, then the
data file; and loads one by reading the index, then the file it names.
Nothing orders two processes doing so at once: two processes compiling the
same function for different types both pick number ``n``, and the index
one leaves can name the data the other wrote, the machine code of other
types.  Loading it crashed the interpreter (a Xeon, this session's test
suite: two test processes compiled :func:`cso.quick_launch.launch_kcrs`
for different types at once; the next process that loaded the one for
float32 KCRS filters called the code of another signature; Numba issue
4807).  cso's functions compile for many types (a launch for each
family's arguments, each nest for each dtype) in whichever processes run
first, so :func:`guard` makes each of their saves and loads hold an
exclusive lock on a file beside the index (``<index>.lock``, ``flock``):
a save's index and data are then written before any other process reads or
writes that index.  Where ``fcntl`` is missing (not POSIX), nothing is
locked, as before (the fingerprint below still applies).

Numba also judges a cached function fresh by its own file alone (its
modification time and size, the index's "stamp"): the functions it calls or
inlines from other modules are compiled into its machine code, and a change
to one of those files alone left the old code in use.  On a Xeon a stale
:func:`cso.quick_launch.launch_kcrs`, whose launch intrinsics live in
:mod:`cso.macrokernel.calling`, crashed the interpreter after only that file
had changed; anyone running cso from a checkout (``pip install -e .``) meets
the same after pulling a change to a callee.  So :func:`guard` also puts a
hash of the package's sources that machine code is generated from
(:func:`source_fingerprint`: every file that imports Numba or llvmlite, the
packages of compiled code, and the analysis and geometry that kernel
builders consult) into the stamp: a change to any of them makes every
guarded function's cache stale, and Numba recompiles it, as it does when
its own file changes.

And Numba starts its threading layer, whose functions (``numba_parallel_for``,
``get_num_threads``, ...) a parallel loop's machine code calls, when it
compiles a parallel loop, and when it loads a cached overload whose
``reload_init`` says it holds one; but an overload compiled in a process
that had *loaded* its parallel callee from the cache (``run_workers``,
inlined through :func:`cso.macrokernel.workers.launch_workers` into
:func:`cso.quick_launch.launch_kcrs`) is saved with an empty ``reload_init``
(the callee's library, rebuilt from its cache, passes none on).  Loaded into
a process that had not started the layer yet, its calls into the layer went
to address 0: a Xeon, 2026-11-29, a packed depthwise plan's third call at
one thread (its quick call, the first compiled code the process ran that
reached the layer) crashed the interpreter or wrote garbage, from this
checkout's cache and not from a fresh one (the previous session's "damaged
cache").  So :func:`guard` also starts the layer before every load
(:func:`start_threading_layer`; once a process, the OpenMP counts kept).

This reaches into Numba's private cache objects
(``dispatcher._cache._cache_file``, its ``save``, ``load``,
``_index_path`` and ``_source_stamp``; Numba 0.68): where a later Numba
renames them, :func:`guard` leaves the function as it is.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no locks
    fcntl = None


def _under_lock(method, lock_path: str):
    """``method`` holding an exclusive ``flock`` on ``lock_path`` (created
    if missing) while it runs; as it is where that file cannot be opened
    (an unwritable directory, whose cache Numba does not write either) or
    there is no ``flock`` (not POSIX)."""

    @functools.wraps(method)
    def locked(*arguments, **keywords):
        if fcntl is None:
            return method(*arguments, **keywords)
        try:
            handle = open(lock_path, "a+b")
        except OSError:
            return method(*arguments, **keywords)
        with handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                return method(*arguments, **keywords)
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    locked.cso_guarded = True
    return locked


# The directory whose sources every guarded function's cache depends on.
PACKAGE_SOURCES = Path(__file__).resolve().parent
# Besides the files that import Numba or llvmlite, the packages of compiled
# code (the loop nests' bounds, say, are a named tuple compiled code reads
# by position) and what kernel builders consult as they generate code
# (relative to the sources' root).
GENERATION_SOURCES = ("analysis", "geometry.py", "macrokernel", "microkernels", "packing")


def _generates_code(root: Path, path: Path) -> bool:
    """Whether ``path``'s code can end up in machine code: it imports Numba
    or llvmlite, or it is one of :data:`GENERATION_SOURCES`."""
    relative = path.relative_to(root).as_posix()
    if any(relative == name or relative.startswith(name + "/") for name in GENERATION_SOURCES):
        return True
    text = path.read_bytes()
    if b"numba" not in text and b"llvmlite" not in text:
        return False
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] in ("numba", "llvmlite") for name in names):
            return True
    return False


@functools.lru_cache(maxsize=None)
def source_fingerprint(root: Path) -> str:
    """The SHA-256 of the ``.py`` files under ``root`` that machine code is
    generated from (:func:`_generates_code`): their paths relative to it and
    their contents, in sorted order (read once a process)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if _generates_code(root, path):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def start_threading_layer() -> None:
    """Start Numba's threading layer (once a process; it returns at once
    after), the OpenMP thread counts kept as they were (:mod:`cso.openmp`)."""
    from numba.np.ufunc import parallel

    from .openmp import kept_openmp_threads

    with kept_openmp_threads():
        parallel._launch_threads()


def _after_threading_layer(method):
    """``method`` (a cache load) once Numba's threading layer has started."""

    @functools.wraps(method)
    def started(*arguments, **keywords):
        start_threading_layer()
        return method(*arguments, **keywords)

    return started


def guard(dispatcher, sources: Path | None = None):
    """Make ``dispatcher``'s cache saves and loads (a Numba function
    compiled with ``cache=True``) hold the lock beside its index, and its
    cache stale whenever any source under ``sources`` (default: the cso
    package, :data:`PACKAGE_SOURCES`) changes, and start Numba's threading
    layer before each load; return it (usable as a decorator).  Idempotent;
    a dispatcher without a disk cache is returned as it is."""
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None or not hasattr(cache_file, "_source_stamp"):
        return dispatcher
    if getattr(cache_file.save, "cso_guarded", False):
        return dispatcher
    root = Path(sources).resolve() if sources is not None else PACKAGE_SOURCES
    own_stamp = cache_file._source_stamp

    def stamped(method):
        # Numba writes the stamp into the index and treats an index of another
        # stamp as empty: its own file's and the sources' together, set at the
        # first save or load (reading the sources takes some 20 ms, once a
        # process: not at import).
        @functools.wraps(method)
        def with_fingerprint(*arguments, **keywords):
            cache_file._source_stamp = (own_stamp, source_fingerprint(root))
            return method(*arguments, **keywords)

        return with_fingerprint

    lock_path = str(cache_file._index_path) + ".lock"
    cache_file.save = _under_lock(stamped(cache_file.save), lock_path)
    cache_file.load = _after_threading_layer(
        _under_lock(stamped(cache_file.load), lock_path)
    )
    return dispatcher


def guard_module(module, sources: Path | None = None) -> None:
    """:func:`guard` every cached Numba function of ``module``."""
    from numba.core.registry import CPUDispatcher

    for value in list(vars(module).values()):
        if isinstance(value, CPUDispatcher):
            guard(value, sources)
