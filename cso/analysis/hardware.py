"""The machine as the analysis sees it: a frozen, injectable description.

``Hardware.detect()`` asks py-cpuinfo first, then Linux's
``/sys/devices/system/cpu``, then falls back to the stated defaults
(:data:`DEFAULT_HARDWARE`), field by field.  py-cpuinfo takes about a second
(it runs a subprocess), so the result is kept in ``hardware.json`` in the
cache directory, keyed by the host, the CPU and the core count, and probed
again whenever that key changes.  Any other machine can be
described by constructing :class:`Hardware` directly, so a plan can be
computed for a machine that is not this one.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from dataclasses import dataclass, replace

_SYSFS_CPU = "/sys/devices/system/cpu"


@dataclass(frozen=True)
class Hardware:
    """Cache sizes, vector width and relative data-movement costs of one core.

    Parameters
    ----------
    l1_bytes, l2_bytes : int
        Per-core private data caches.
    l3_bytes : int
        The last-level cache, shared by all cores.
    line_bytes : int
        Cache line size.
    vector_bytes : int
        Width of one SIMD register (64 for AVX-512, 32 for AVX2, 16 for NEON/SSE).
    vector_registers : int
        Architectural SIMD registers (32 with AVX-512 or NEON, 16 with AVX2).
    cores : int
        Cores available to the worker threads.
    usable_fraction : float
        Share of each cache the tiles may occupy (the rest is left to the
        stack, the output rows and associativity conflicts).
    l1_cost, l2_cost, l3_cost, dram_cost : float
        Relative cost of moving one byte out of each level (L1 = 1).  Used
        only to compare schedules, so only ratios matter.  L2 is cheap
        (0.25): the micro-kernel consumes its streamed operand at about
        10 bytes per cycle, far below what L2 delivers, so that traffic hides
        behind the FMAs.  These defaults were set by comparing the model's
        IS/WS choice with both schedules timed on ResNet-50's layers on an
        AVX-512 Xeon (experiments/schedule_choice.py): it agrees on 13 of the
        14 layers where the two differ by more than 3%.
    page_bytes, tlb_entries : int
        Page size and first-level data-TLB entries.
    tlb_miss_cost : float
        Cost of one first-level TLB miss in the same units (about 8 cycles at
        L1's ~128 bytes per cycle).
    call_cost : float
        Fixed cost of one micro-kernel call (output write-back, operand
        streams restarting): about 300 cycles, measured here as 50-210 ns per
        call by timing one layer with its channel tile varied (more tiles,
        more calls of shorter depth, the same multiply-adds).
    sweep_fraction : float
        Share of a level's usable bytes that a block swept over and over
        (the K2 block in L2, the K3 block in L3) may take.  An LRU-like cache
        keeps a cyclically swept working set only well below its capacity
        (prefetched lines and the output rows written during each sweep
        compete for the same sets); 2/3 of the usable 90%, i.e. 60% of L2,
        measured 13% faster over ResNet-50 here than the full 90%.
    mac_cost : float
        Cost of one float32 multiply-add in the micro-kernel: L1 moves ~128
        bytes per cycle and two 16-lane FMAs retire per cycle, so a MAC is
        worth 128 / 32 = 4 bytes of L1 traffic.
    l1_miss_cost : float
        Cost per byte of a stationary tile that does not fit in L1 and is
        read from L2 on every call, with the other operand streaming from L2
        too: unlike a single L2 stream, this is not hidden behind the FMAs.
    transposed_store_cost : float
        Cost of storing one output element from a filter-vectorised
        micro-kernel.  128 units (about a cycle) was measured when the tile
        was written lane by lane; transposed in registers it now takes some
        0.35 cycle.  The measured value (60) flips 17 of 140 ResNet-50 and
        VGG-16 plans and loses on VGG-16's per-call 3x3 layers (0.92-0.98x,
        one-off script), so some other term of those plans is low and 128
        stays as a calibration until it is found.
    filter_pack_cost : float
        Cost of packing one filter element per call, which a
        filter-vectorised micro-kernel needs unless the filters were packed
        ahead of time (a vector transpose, measured 13-20 GB/s per core
        here, about memcpy's rate for filters beyond L2: some 1.4 elements
        per cycle, 100 units).
    input_pack_cost : float
        Cost of packing one input element into a panel (window expansion:
        every element of every packed tile written once).  Measured here
        over ResNet-50's layers, by timing each call with and without its
        packing: 0.07-0.5 ns per element, median 0.17 ns, about 80 units
        (the model's units run at some 450 million per millisecond).
        Without it the model priced a packed byte like an L2 write (0.25),
        some 80 times too cheap to weigh re-packing against idle threads.
    in_place_filter_cost : float
        Extra cost per filter element a window-vectorised micro-kernel reads
        in place from the KCRS array (one broadcast from each of ``Nf`` rows
        ``C*R*S`` elements apart per step) instead of from a packed panel.
        ``experiments/in_place_filters.py`` runs each of ResNet-50's 23
        window-vectorised per-call plans both ways: median 0.011 ns, about
        6 units, per element (the layers' own figures spread from -9 to 30).
        It is what a per-call filter-vectorised plan saves besides padding,
        against the packing it pays for.
    stream_overlap : float
        Share of the cost of WS's filter stream from L3 or DRAM that hides
        behind the micro-kernels' multiply-adds, up to their cost: the model
        charges ``stream + macs - stream_overlap * min(stream, macs)``
        (:func:`~cso.analysis.cost.hidden_stream_cost`); 0 sums them, 1
        charges the larger.  ``experiments/cost_weight.py`` times the plans
        a value changes against the plans at 0.  At 0.5 it changed 16 of
        ResNet-50's and VGG-16's plans (batch 1 at one and two threads, per
        call and packed ahead, batch 8): 1.02-1.08x over the changed layers
        of each run, none slower than 0.97x.  At 1 some ran 0.91-0.95x, and
        crediting IS's streams too moved 3x3 layers at two threads to IS,
        0.90-0.95x.
    source : str
        Where the figures came from ("py-cpuinfo", "sysfs", "defaults", "user").
    """

    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 8 * 1024 * 1024
    line_bytes: int = 64
    vector_bytes: int = 32
    vector_registers: int = 16
    cores: int = 1
    usable_fraction: float = 0.9
    l1_cost: float = 1.0
    l2_cost: float = 0.25
    l3_cost: float = 6.0
    dram_cost: float = 20.0
    page_bytes: int = 4096
    tlb_entries: int = 64
    tlb_miss_cost: float = 1000.0
    call_cost: float = 40000.0
    mac_cost: float = 4.0
    sweep_fraction: float = 2 / 3
    l1_miss_cost: float = 2.0
    transposed_store_cost: float = 128.0
    filter_pack_cost: float = 100.0
    input_pack_cost: float = 80.0
    in_place_filter_cost: float = 6.0
    stream_overlap: float = 0.5
    source: str = "user"

    def __post_init__(self):
        for name in (
            "l1_bytes",
            "l2_bytes",
            "l3_bytes",
            "line_bytes",
            "vector_bytes",
            "vector_registers",
            "cores",
            "page_bytes",
            "tlb_entries",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Hardware.{name} must be a positive int, got {value!r}")
        for name in ("usable_fraction", "sweep_fraction"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"Hardware.{name} must be in (0, 1], got {getattr(self, name)!r}")
        if not 0.0 <= self.stream_overlap <= 1.0:
            raise ValueError(
                f"Hardware.stream_overlap must be in [0, 1], got {self.stream_overlap!r}"
            )

    @staticmethod
    def detect() -> "Hardware":
        """Describe this machine (memoised: the probes run once per process).

        The environment variables ``CSO_L1``, ``CSO_L2``, ``CSO_L3``,
        ``CSO_LINE``, ``CSO_VECTOR_BYTES``, ``CSO_VECTOR_REGISTERS`` and
        ``CSO_CORES`` (sizes accept ``K``/``M``/``G`` suffixes) override what
        was detected, so plans for another machine can be made here; they are
        read at the first call (a bad value raises, then and at every call
        until it is fixed).
        """
        return _with_environment_once(_detect())

    def with_changes(self, **changes) -> "Hardware":
        """A copy with some fields replaced (e.g. ``l2_bytes=1 << 20``)."""
        return replace(self, **changes)


DEFAULT_HARDWARE = Hardware(source="defaults")


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


def _from_cpuinfo(cores: int) -> dict:
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


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _from_sysfs(root: str = _SYSFS_CPU) -> dict:
    """Per-core cache sizes from ``cpu0/cache/index*``, or ``{}``."""
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
            level, kind, size = int(read("level")), read("type"), _parse_size(read("size"))
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        fields.setdefault({1: "l1_bytes", 2: "l2_bytes", 3: "l3_bytes"}.get(level, "other"), size)
        try:
            fields.setdefault("line_bytes", int(read("coherency_line_size")))
        except (OSError, ValueError):
            pass
    fields.pop("other", None)
    return fields


def _flags_from_proc() -> list:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def _machine_key() -> str:
    brand = ""
    try:
        with open("/proc/cpuinfo") as handle:
            brand = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                "",
            )
    except OSError:
        pass
    return f"{platform.node()}|{platform.machine()}|{brand}|{_cores()}"


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _probe() -> Hardware:
    cores = _cores()
    found_fields = {"cores": cores}
    sources = []
    for name, probe in (("py-cpuinfo", lambda: _from_cpuinfo(cores)), ("sysfs", _from_sysfs)):
        found = {k: v for k, v in probe().items() if k not in found_fields}
        if found:
            sources.append(name)
            found_fields.update(found)
    if "vector_bytes" not in found_fields:
        flags = _flags_from_proc()
        if flags:
            found_fields["vector_bytes"], found_fields["vector_registers"] = (
                _vector_shape_from_flags(flags)
            )
    if len(found_fields) < 7:
        sources.append("defaults")
    return replace(DEFAULT_HARDWARE, **found_fields, source="+".join(sources) or "defaults")


@functools.lru_cache(maxsize=4)
def _with_environment_once(hardware: Hardware) -> Hardware:
    # Memoised: reading seven environment variables cost 5 us of every call.
    return _with_environment(hardware, os.environ)


@functools.lru_cache(maxsize=1)
def _detect() -> Hardware:
    from ..cachedir import cache_directory

    path = cache_directory() / "hardware.json"
    key = _machine_key()
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            # Only what was probed is stored; the costs are today's defaults.
            return replace(DEFAULT_HARDWARE, **{k: stored["probed"][k] for k in _PROBED})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # absent, unreadable or stale: probe again
    hardware = _probe()
    try:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        probed = {k: getattr(hardware, k) for k in _PROBED}
        temporary.write_text(json.dumps({"key": key, "probed": probed}))
        os.replace(temporary, path)
    except OSError:
        pass
    return hardware


# The fields detection finds; everything else comes from DEFAULT_HARDWARE.
_PROBED = (
    "l1_bytes",
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


def parse_size(text: str, name: str) -> int:
    """``"32K"``, ``"1M"``, ``"4096"`` as bytes; ValueError naming ``name`` otherwise."""
    try:
        value = _parse_size(str(text))
    except ValueError:
        raise ValueError(f"{name} must be a size like 32K, 1M or 4096, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be positive, got {text!r}")
    return value


@functools.lru_cache(maxsize=8)
def _with_environment_cached(hardware, overrides):
    if not overrides:
        return hardware
    return replace(hardware, **dict(overrides), source=f"{hardware.source}+environment")


def _with_environment(hardware: Hardware, environment) -> Hardware:
    overrides = tuple(
        (field, parse_size(environment[variable], variable))
        for variable, field in _ENVIRONMENT.items()
        if environment.get(variable)
    )
    return _with_environment_cached(hardware, overrides)
