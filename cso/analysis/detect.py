"""Detecting this machine: Linux's ``/sys``, then py-cpuinfo, then defaults.

:func:`detect_hardware` asks ``/sys/devices/system/cpu`` and
``/proc/cpuinfo``'s flags first, then py-cpuinfo for whatever they did not
give, then falls back to the stated defaults
(:data:`~cso.analysis.hardware.DEFAULT_HARDWARE`), field by field.
py-cpuinfo takes about a second (it runs a subprocess), so the result is
kept in ``hardware.json`` in the cache directory, keyed by the host, the
CPU and the core count, and probed again whenever that key changes.  The
environment variables ``CSO_L1``, ``CSO_L2``, ``CSO_L3``, ``CSO_LINE``,
``CSO_VECTOR_BYTES``, ``CSO_VECTOR_REGISTERS`` and ``CSO_CORES`` override
what was detected.  The cost weights are this machine's calibration when
``python -m cso calibrate`` has measured one
(:mod:`cso.analysis.calibration_store`), else the defaults.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from dataclasses import replace

from ..cachedir import cache_directory, write_text_atomically
from ..untrusted import read_json_file
from .calibration_store import apply_calibration, cpu_model
from .hardware import DEFAULT_HARDWARE, Hardware, parse_size

_SYSFS_CPU = "/sys/devices/system/cpu"


def detect_hardware() -> Hardware:
    """Describe this machine (memoised: the probes run once per process).

    The environment variables ``CSO_L1``, ``CSO_L2``, ``CSO_L3``,
    ``CSO_LINE``, ``CSO_VECTOR_BYTES``, ``CSO_VECTOR_REGISTERS`` and
    ``CSO_CORES`` (sizes accept ``K``/``M``/``G`` suffixes) override what
    was detected, so plans for another machine can be made here; they are
    read at the first call (a bad value raises, then and at every call
    until it is fixed).  The cost weights are the calibrated ones when this
    machine has a calibration (``python -m cso calibrate``; ``CSO_CALIBRATION``
    chooses another file or ``off``), else the defaults
    (:data:`~cso.analysis.weights.DEFAULT_WEIGHTS`), said once per machine
    in a :class:`~cso.analysis.calibration_store.CalibrationWarning`.
    """
    return _calibrated_once(_with_environment_once(stored_or_probed()))


@functools.lru_cache(maxsize=4)
def _calibrated_once(hardware: Hardware) -> Hardware:
    # Memoised: the store is read once per process.
    return apply_calibration(hardware)


def _vector_shape_from_flags(flags) -> tuple:
    """(vector_bytes, vector_registers) from CPU feature flags."""
    flags = set(flags)
    if "avx512f" in flags:
        return 64, 32
    if "avx2" in flags or "avx" in flags:
        return 32, 16
    if "asimd" in flags or "neon" in flags:
        return 16, 32
    return 16, 16


def from_cpuinfo(cores: int) -> dict:
    """Fields from py-cpuinfo, or ``{}`` when it is absent or silent.

    On Linux py-cpuinfo reads ``lscpu``, whose L1d and L2 figures are the sum
    over all cores' private caches ("96 KiB (2 instances)"), so they are
    divided by the core count.  Its line size is taken only when plausible.
    """
    try:
        import cpuinfo  # py-cpuinfo

        info = cpuinfo.get_cpu_info() or {}
    except Exception:  # absent, or failing on an exotic platform: fall through
        return {}
    fields = {}
    count = int(info.get("count") or cores) or 1
    if info.get("l1_data_cache_size"):
        fields["l1_bytes"] = max(1, int(info["l1_data_cache_size"]) // count)
    if info.get("l2_cache_size"):
        fields["l2_bytes"] = max(1, int(info["l2_cache_size"]) // count)
    if info.get("l3_cache_size"):
        fields["l3_bytes"] = int(info["l3_cache_size"])
    line = info.get("l2_cache_line_size")
    if line in (32, 64, 128, 256):
        fields["line_bytes"] = int(line)
    if info.get("flags"):
        fields["vector_bytes"], fields["vector_registers"] = _vector_shape_from_flags(info["flags"])
    return fields


def from_sysfs(root: str = _SYSFS_CPU) -> dict:
    """Per-core cache sizes and L1 associativity from ``cpu0/cache/index*``, or ``{}``."""
    fields = {}
    cache_dir = os.path.join(root, "cpu0", "cache")
    try:
        entries = sorted(e for e in os.listdir(cache_dir) if e.startswith("index"))
    except OSError:
        return {}
    for entry in entries:

        def read(name):
            with open(os.path.join(cache_dir, entry, name)) as handle:
                return handle.read().strip()

        try:
            level, kind, size = int(read("level")), read("type"), parse_size(read("size"), "size")
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        fields.setdefault({1: "l1_bytes", 2: "l2_bytes", 3: "l3_bytes"}.get(level, "other"), size)
        if level == 1:
            try:
                fields.setdefault("l1_ways", int(read("ways_of_associativity")))
            except (OSError, ValueError):
                pass
        try:
            fields.setdefault("line_bytes", int(read("coherency_line_size")))
        except (OSError, ValueError):
            pass
    fields.pop("other", None)
    return fields


def flags_from_proc() -> list:
    """The CPU feature flags of /proc/cpuinfo, or [] where it is unreadable."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def machine_key() -> str:
    """What the stored description is keyed by: host, architecture, CPU model, cores."""
    return f"{_STORE_VERSION}|{platform.node()}|{platform.machine()}|{cpu_model()}|{_cores()}"


# Raised when what probe() finds changes, so that stored descriptions are probed again
# (2: /sys before py-cpuinfo, and the L1's ways; 3: the CPU's family, model and
# vector instruction set in the key).
_STORE_VERSION = 3


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def probe() -> Hardware:
    """Ask ``/sys``, then ``/proc/cpuinfo``'s flags, then py-cpuinfo for what
    is still missing; defaults for the rest.

    The kernel's ``/sys`` figures come first: py-cpuinfo reads the L3 size
    from ``/proc/cpuinfo``'s "cache size", which on AMD EPYC (Zen 4) is the
    1 MiB L2, not the 32 MiB L3 (measured: cso planned every layer there
    for a 1 MiB L3 until this order was changed).
    """
    cores = _cores()
    found_fields = {"cores": cores}
    sources = []

    def take(name, fields):
        found = {k: v for k, v in fields.items() if k not in found_fields and _plausible(k, v)}
        if found:
            sources.append(name)
            found_fields.update(found)

    def incomplete() -> bool:
        return len(found_fields) < len(PROBED_FIELDS) - 1  # all but the source

    take("sysfs", from_sysfs())
    flags = flags_from_proc()
    if flags:
        take("cpuinfo-flags", dict(zip(("vector_bytes", "vector_registers"),
                                       _vector_shape_from_flags(flags))))  # fmt: skip
    if incomplete():
        take("py-cpuinfo", from_cpuinfo(cores))
    if incomplete():
        sources.append("defaults")
    return replace(DEFAULT_HARDWARE, **found_fields, source="+".join(sources) or "defaults")


def _plausible(field: str, value) -> bool:
    """Whether a probed figure is in the range :class:`Hardware` accepts (a
    misreported one falls through to the next source)."""
    try:
        replace(DEFAULT_HARDWARE, **{field: value})
    except (TypeError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=4)
def _with_environment_once(hardware: Hardware) -> Hardware:
    # Memoised: reading seven environment variables cost 5 us of every call.
    return with_environment(hardware, os.environ)


@functools.lru_cache(maxsize=1)
def stored_or_probed() -> Hardware:
    """The description stored for this machine's :func:`machine_key`, or a
    fresh :func:`probe` (then stored); memoised for the process."""
    path = cache_directory() / "hardware.json"
    key = machine_key()
    try:
        stored = read_json_file(path, max_bytes=_MAX_STORED_BYTES)
        if stored.get("key") == key:
            # Only what was probed is stored; the costs are today's defaults.
            # Hardware validates every field (type and real-machine range).
            return replace(DEFAULT_HARDWARE, **{k: stored["probed"][k] for k in PROBED_FIELDS})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # absent, unreadable, damaged, out of range or stale: probe again
    hardware = probe()
    try:
        probed = {k: getattr(hardware, k) for k in PROBED_FIELDS}
        write_text_atomically(path, json.dumps({"key": key, "probed": probed}))
    except OSError:
        pass
    return hardware


_MAX_STORED_BYTES = 64 * 1024

# The fields detection finds; everything else comes from DEFAULT_HARDWARE.
PROBED_FIELDS = (
    "l1_bytes",
    "l1_ways",
    "l2_bytes",
    "l3_bytes",
    "line_bytes",
    "vector_bytes",
    "vector_registers",
    "cores",
    "source",
)


_ENVIRONMENT = {
    "CSO_L1": "l1_bytes",
    "CSO_L2": "l2_bytes",
    "CSO_L3": "l3_bytes",
    "CSO_LINE": "line_bytes",
    "CSO_VECTOR_BYTES": "vector_bytes",
    "CSO_VECTOR_REGISTERS": "vector_registers",
    "CSO_CORES": "cores",
}


@functools.lru_cache(maxsize=8)
def _with_environment_cached(hardware, overrides):
    if not overrides:
        return hardware
    for variable, field, value in overrides:
        try:
            replace(hardware, **{field: value})
        except ValueError as error:
            raise ValueError(f"{variable}={value}: {error}") from None
    fields = {field: value for _, field, value in overrides}
    return replace(hardware, **fields, source=f"{hardware.source}+environment")


def with_environment(hardware: Hardware, environment) -> Hardware:
    """``hardware`` with the ``CSO_*`` variables of ``environment`` applied.

    Raises
    ------
    ValueError
        Naming the variable, when its value is not a size or outside what
        :class:`~cso.analysis.hardware.Hardware` accepts (real machines' ranges).
    """
    overrides = tuple(
        (variable, field, parse_size(environment[variable], variable))
        for variable, field in _ENVIRONMENT.items()
        if environment.get(variable)
    )
    if not overrides:
        return hardware  # itself, not an equal one the memo kept
    return _with_environment_cached(hardware, overrides)
