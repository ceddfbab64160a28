"""The machine as the analysis sees it: a frozen, injectable description.

:class:`Hardware` describes one core's caches, vectors and the cores
available; its cost weights are a :class:`~cso.analysis.weights.CostWeights`
of their own.  Detecting this machine's figures is :mod:`cso.analysis.detect`'s
job; any other machine is described by constructing :class:`Hardware`
directly, so that a plan can be computed for a machine that is not this one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from .weights import DEFAULT_WEIGHTS, CostWeights

# The dense micro-kernels' software prefetch by default, reduction steps ahead
# (1-2 KiB of a packed panel): Hardware.kernel_prefetch_distance's default.
KERNEL_PREFETCH_DISTANCE = 16


@dataclass(frozen=True)
class Hardware:
    """Cache sizes, vector width and core count of one machine, with the cost weights.

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
    page_bytes, tlb_entries : int
        Page size and first-level data-TLB entries.
    l1_ways : int
        Associativity of the L1 data cache: how many lines whose addresses
        map to one set it holds at once (8 on Zen 4, 12 on Sapphire Rapids).
    kernel_prefetch_distance : int
        Reduction steps ahead at which the dense micro-kernels prefetch the
        rows they stream (0: none, the hardware prefetchers alone).  The
        default, :data:`KERNEL_PREFETCH_DISTANCE`, was measured best of 8,
        16 and 32 on a Xeon, where the hardware prefetchers alone left
        ResNet-50's layers 2-9% slower; ``python -m cso calibrate`` times
        both and keeps the faster (:func:`~cso.analysis.calibration.kernel_prefetch_distance`):
        on an AMD EPYC (Zen 3) the layers ran 3-5% faster without.
    weights : CostWeights
        What the cost model charges for each quantity it counts
        (:mod:`cso.analysis.weights`).
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
    page_bytes: int = 4096
    tlb_entries: int = 64
    l1_ways: int = 8
    kernel_prefetch_distance: int = KERNEL_PREFETCH_DISTANCE
    weights: CostWeights = DEFAULT_WEIGHTS
    source: str = "user"

    def __post_init__(self):
        for name, (low, high) in _LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Hardware.{name} must be an int, got {value!r}")
            if not low <= value <= high:
                raise ValueError(
                    f"Hardware.{name} must be between {low} and {high} (what real machines "
                    f"have), got {value!r}"
                )
        for name in _POWERS_OF_TWO:
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"Hardware.{name} must be a power of two, got {value!r}")
        if not isinstance(self.source, str):
            raise TypeError(f"Hardware.source must be a str, got {self.source!r}")
        if isinstance(self.usable_fraction, bool) or not isinstance(
            self.usable_fraction, (int, float)
        ):
            raise TypeError(
                f"Hardware.usable_fraction must be a number, got {self.usable_fraction!r}"
            )
        if not 0.0 < self.usable_fraction <= 1.0:
            raise ValueError(
                f"Hardware.usable_fraction must be in (0, 1], got {self.usable_fraction!r}"
            )
        if not isinstance(self.weights, CostWeights):
            raise TypeError(
                f"Hardware.weights must be a cso.CostWeights, got {type(self.weights).__name__}"
            )

    def with_changes(self, **changes) -> "Hardware":
        """A copy with some fields replaced (e.g. ``l2_bytes=1 << 20``); a
        cost weight's name (e.g. ``call_cost=2e4``) replaces that weight (and
        marks the weights' ``origin`` ``"user"``)."""
        weight_names = {field.name for field in fields(CostWeights)}
        weight_changes = {k: changes.pop(k) for k in list(changes) if k in weight_names}
        if weight_changes:
            weight_changes.setdefault("origin", "user")
            changes["weights"] = replace(self.weights, **weight_changes)
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain JSON-able fields, the weights nested; :meth:`from_dict` inverts it."""
        return asdict(self)

    @staticmethod
    def from_dict(values: dict) -> "Hardware":
        """The :class:`Hardware` :meth:`to_dict` described.

        Raises TypeError or ValueError if ``values`` is malformed.
        """
        values = dict(values)
        weights = values.pop("weights", {})
        if not isinstance(weights, dict):
            raise TypeError(f"Hardware weights must be a mapping, got {type(weights).__name__}")
        return Hardware(**values, weights=CostWeights(**weights))


# Each integer field's range: what real machines have, with room to spare.
# They bound what a hardware.json, an environment variable or a stored plan
# can make the analysis and the kernel generator do (vector_registers 10**6
# would generate a kernel of a million accumulators).
_LIMITS = {
    "l1_bytes": (1024, 1 << 20),  # 1 KiB .. 1 MiB (Apple M-series: 128 KiB)
    "l2_bytes": (1024, 1 << 28),  # .. 256 MiB
    "l3_bytes": (1024, 1 << 34),  # .. 16 GiB (AMD 3D V-Cache parts: 1.1 GiB)
    "line_bytes": (16, 256),
    "vector_bytes": (16, 256),  # SSE / NEON .. SVE's 2048 bits
    "vector_registers": (8, 32),  # x86 SSE without REX .. AVX-512, NEON, SVE
    "cores": (1, 1 << 16),
    "page_bytes": (1024, 1 << 30),
    "tlb_entries": (1, 1 << 16),
    "l1_ways": (1, 64),
    "kernel_prefetch_distance": (0, 256),
}
_POWERS_OF_TWO = ("line_bytes", "vector_bytes", "page_bytes")

DEFAULT_HARDWARE = Hardware(source="defaults")


def parse_size(text: str, name: str) -> int:
    """``"32K"``, ``"1M"``, ``"4096"`` as bytes; ValueError naming ``name`` otherwise."""
    text = str(text).strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    try:
        value = int(text.rstrip("KMG")) * scale
    except ValueError:
        raise ValueError(f"{name} must be a size like 32K, 1M or 4096, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be positive, got {text!r}")
    return value
