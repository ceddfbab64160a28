"""The per-user directory where cso keeps generated kernels and the machine description."""

from __future__ import annotations

import functools
import os
import pathlib
import tempfile
import threading


@functools.lru_cache(maxsize=None)
def _resolve(configured: str) -> pathlib.Path:
    candidates = [configured, os.path.join(os.path.expanduser("~"), ".cache", "cso")]
    for candidate in candidates:
        if not candidate:
            continue
        path = pathlib.Path(candidate)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".probe-{os.getpid()}-{threading.get_ident()}"
            probe.write_text("")
            probe.unlink()
            return path
        except OSError:
            continue
    return pathlib.Path(tempfile.mkdtemp(prefix="cso-cache-"))


def cache_directory() -> pathlib.Path:
    """``$CSO_CACHE_DIR``, else ``~/.cache/cso``; a temporary directory when
    neither is writable (nothing is then reused across processes)."""
    return _resolve(os.environ.get("CSO_CACHE_DIR", ""))
