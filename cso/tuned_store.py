"""The on-disk store of tuned plans.

:class:`TunedPlans` keeps the plans :func:`cso.tune` found fastest in a JSON
file keyed by the problem, the hardware fingerprint and the cso version;
``cso.conv2d(..., tuned=True)`` consults it through :func:`tuned_plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import threading
import warnings

from ._version import __version__
from .analysis.detect import detect_hardware
from .analysis.hardware import Hardware
from .analysis.plan import Plan
from .cachedir import cache_directory, write_text_atomically
from .geometry import ConvGeometry
from .untrusted import UntrustedFileError, read_json_file

STORE_FORMAT = "cso-tuned-plans"
STORE_VERSION = 2  # 2: the plans' hardware nests its cost weights
_MAX_STORE_BYTES = 64 * 1024 * 1024


def hardware_fingerprint(hardware: Hardware) -> str:
    """The machine a tuned plan was measured on: its caches, vectors and
    cores, not where the figures came from nor what the calibration sets
    (the cost weights and the kernels' prefetch: a tuned plan is a
    measurement, as good after ``python -m cso calibrate`` as before it,
    and runs with the prefetch its own hardware names)."""
    fields = dataclasses.asdict(hardware)
    fields.pop("source", None)
    fields.pop("weights", None)
    fields.pop("kernel_prefetch_distance", None)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _problem_key(geometry: ConvGeometry, dtype_name: str, threads: int) -> str:
    return json.dumps([dataclasses.asdict(geometry), dtype_name, threads], sort_keys=True)


class TunedPlans:
    """A JSON file of tuned plans keyed by problem, hardware fingerprint and cso version.

    A missing file is an empty store; an unreadable, damaged or foreign one is
    ignored with a warning, and entries of another cso version or another
    machine are never returned.
    """

    _lock = threading.Lock()

    def __init__(self, path=None):
        if path is None:
            path = cache_directory() / "tuned_plans.json"
        self.path = pathlib.Path(os.fspath(path))

    def _read(self) -> dict:
        try:
            content = read_json_file(self.path, max_bytes=_MAX_STORE_BYTES)
        except FileNotFoundError:
            return {}
        except OSError as error:
            warnings.warn(
                f"tuned-plans store {self.path} is unreadable ({error}); ignored",
                RuntimeWarning,
                stacklevel=3,
            )
            return {}
        except UntrustedFileError as error:
            warnings.warn(
                f"tuned-plans store {self.path} is damaged ({error}); ignored",
                RuntimeWarning,
                stacklevel=3,
            )
            return {}
        try:
            if content.get("format") != STORE_FORMAT or content.get("version") != STORE_VERSION:
                raise ValueError("not a cso tuned-plans store of this version")
            entries = content["entries"]
            if not isinstance(entries, dict):
                raise ValueError("entries is not an object")
            return entries
        except (ValueError, AttributeError, KeyError, TypeError) as error:
            warnings.warn(
                f"tuned-plans store {self.path} is damaged or stale ({error}); ignored",
                RuntimeWarning,
                stacklevel=3,
            )
            return {}

    @staticmethod
    def key(geometry, dtype_name, hardware, threads) -> str:
        return "|".join(
            (
                __version__,
                hardware_fingerprint(hardware),
                _problem_key(geometry, dtype_name, threads),
            )
        )

    def get(
        self, geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int
    ) -> Plan | None:
        """The stored plan for this problem on this machine and version, or None."""
        entry = self._read().get(self.key(geometry, dtype_name, hardware, threads))
        if entry is None:
            return None
        try:
            # Every field is validated as the plan is made (analysis/plan_checks.py).
            plan = Plan.from_dict(entry)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as error:
            warnings.warn(
                f"tuned plan in {self.path} is malformed ({error!r}); ignored",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        if (
            not plan.matches(geometry, dtype_name)
            or plan.threads != threads
            or hardware_fingerprint(plan.hardware) != hardware_fingerprint(hardware)
        ):
            warnings.warn(
                f"tuned plan in {self.path} does not fit its key (another problem, thread "
                "count or machine); ignored",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        return plan

    def put(self, plan: Plan) -> None:
        """Store ``plan`` under its own problem, hardware and thread count."""
        with self._lock:
            entries = self._read()
            entries[self.key(plan.geometry, plan.dtype, plan.hardware, plan.threads)] = (
                plan.to_dict()
            )
            content = {"format": STORE_FORMAT, "version": STORE_VERSION, "entries": entries}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomically(self.path, json.dumps(content))


def check_tuned(tuned):
    """``conv2d``'s ``tuned``: True, False, or a path (str or path-like).

    Raises
    ------
    TypeError
        Naming ``tuned``, for anything else (``tuned=1`` included).
    """
    if isinstance(tuned, bool) or isinstance(tuned, (str, os.PathLike)):
        return tuned
    raise TypeError(
        f"tuned must be True, False or the path of a tuned-plans store, got "
        f"{type(tuned).__name__} {tuned!r}"
    )


def tuned_plan(geometry, dtype_name, threads, tuned) -> Plan | None:
    """The stored plan ``cso.conv2d(..., tuned=...)`` should use, if any.

    A store named by path that does not exist is an empty store, said in a
    warning (the default store, ``tuned=True``, is simply empty until
    :func:`cso.tune` writes it).
    """
    store = TunedPlans(None if tuned is True else tuned)
    if tuned is not True and not store.path.exists():
        _warn_missing(str(store.path))
    return store.get(geometry, dtype_name, detect_hardware(), threads)


@functools.lru_cache(maxsize=64)
def _warn_missing(path: str) -> None:
    # Once per path and process: a loop of calls should not repeat it.
    warnings.warn(
        f"tuned-plans store {path} does not exist; the analysis' plans are used",
        RuntimeWarning,
        stacklevel=4,
    )
