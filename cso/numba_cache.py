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
locked, as before.  This reaches into Numba's private cache objects
(``dispatcher._cache._cache_file``, its ``save``, ``load`` and
``_index_path``; Numba 0.68): where a later Numba renames them, :func:`guard`
leaves the function as it is.
"""

from __future__ import annotations

import functools

try:
    import fcntl
except ImportError:  # not POSIX: no locks
    fcntl = None


def _under_lock(method, lock_path: str):
    """``method`` holding an exclusive ``flock`` on ``lock_path`` (created
    if missing) while it runs; as it is where that file cannot be opened
    (an unwritable directory, whose cache Numba does not write either)."""

    @functools.wraps(method)
    def locked(*arguments, **keywords):
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


def guard(dispatcher):
    """Make ``dispatcher``'s cache saves and loads (a Numba function
    compiled with ``cache=True``) hold the lock beside its index; return it
    (usable as a decorator).  Idempotent; a dispatcher without a disk cache
    is returned as it is."""
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if fcntl is None or cache_file is None:
        return dispatcher
    if getattr(cache_file.save, "cso_guarded", False):
        return dispatcher
    lock_path = str(cache_file._index_path) + ".lock"
    cache_file.save = _under_lock(cache_file.save, lock_path)
    cache_file.load = _under_lock(cache_file.load, lock_path)
    return dispatcher


def guard_module(module) -> None:
    """:func:`guard` every cached Numba function of ``module``."""
    from numba.core.registry import CPUDispatcher

    for value in list(vars(module).values()):
        if isinstance(value, CPUDispatcher):
            guard(value)
