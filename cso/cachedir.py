"""The per-user directory where cso keeps generated kernels and the machine description."""

from __future__ import annotations

import functools
import os
import pathlib
import stat
import tempfile
import threading
import warnings


def _writable(path: pathlib.Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


def fallback_directory() -> pathlib.Path:
    """The one per-user directory used when the configured one is unusable:
    ``<tempdir>/cso-cache-<uid>``, shared by every process of that user."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return pathlib.Path(tempfile.gettempdir()) / f"cso-cache-{user}"


def _owned_private_directory(path: pathlib.Path) -> bool:
    # A shared temporary directory: another user could have made this path
    # first (or a symlink there); cso only uses one that is this user's own.
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        status = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(status.st_mode):
        return False
    if hasattr(os, "getuid") and status.st_uid != os.getuid():
        return False
    return _writable(path)


@functools.lru_cache(maxsize=None)
def _resolve(configured: str) -> pathlib.Path:
    default = os.path.join(os.path.expanduser("~"), ".cache", "cso")
    for candidate in (configured, default):
        if candidate and _writable(pathlib.Path(candidate)):
            return pathlib.Path(candidate)
    tried = configured or default
    fallback = fallback_directory()
    if _owned_private_directory(fallback):
        chosen, reused = fallback, "kept across processes"
    else:
        chosen, reused = pathlib.Path(tempfile.mkdtemp(prefix="cso-cache-")), "this process only"
    # Once per process (memoised): kernels compiled here are not lost silently.
    warnings.warn(
        f"cso cache directory {tried} is not writable; using {chosen} ({reused}). "
        "Set CSO_CACHE_DIR to a writable directory to keep compiled kernels there.",
        RuntimeWarning,
        stacklevel=3,
    )
    return chosen


def cache_directory() -> pathlib.Path:
    """``$CSO_CACHE_DIR``, else ``~/.cache/cso``; when neither is writable,
    ``<tempdir>/cso-cache-<uid>`` (said in a warning once per process)."""
    return _resolve(os.environ.get("CSO_CACHE_DIR", ""))


def write_text_atomically(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so
    that a concurrent reader (another process or thread) never sees half a
    file.  ``OSError`` propagates."""
    path = pathlib.Path(path)
    temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
