"""Measuring this machine for the cost model: ``python -m cso calibrate``.

:func:`measure_rates` runs the probes (:mod:`.kernel_probes`,
:mod:`.memory_probes`, :mod:`.loop_probes`) in the order of
:func:`~cso.calibrate.steps.calibration_steps` and returns the
:class:`~cso.analysis.calibration.MeasuredRates` the weights are derived
from (:func:`~cso.analysis.calibration.derive_weights`).  The probes plan
with the default weights, so a calibration does not depend on an earlier
one.  :mod:`.cli` is the command line.
"""

from __future__ import annotations

import time
from dataclasses import replace

from ..analysis.calibration import MeasuredRates, kernel_prefetch_distance
from ..analysis.weights import DEFAULT_WEIGHTS
from ..openmp import kept_openmp_threads
from . import prefetch_probe
from .steps import calibration_steps
from .timing import (  # noqa: F401  (the in-place sampling rule, public here)
    IN_PLACE_MAX_SAMPLES,
    IN_PLACE_PRECISION,
    median_of,
    median_standard_error,
    precise_enough,
)


# The probes whose figure is a difference or a slope, or shared with the
# machine's other tenants (filter packing writes megabytes: two calibrations
# measured 78 and 140 units from one timing each): measured several times,
# the median kept.  (The bandwidths, the kernels' rates from L1, the filters'
# packing and the kernel calls keep the best of samples spread over the
# calibration instead: steps.py.)
REPEATED = frozenset(
    (
        "l1_spill_seconds_per_byte",
        "l2_line_reload_seconds",
        "tlb_miss_seconds",
        "transposed_store_seconds",
        "filter_pack_shared_seconds",
        "filter_pack_call_seconds",
        "lane_transpose_seconds",
        "tap_nest_call_seconds",
        "in_place_input_seconds",
    )
)


# Differences of times that may be nothing at all: 0 unless they stand out
# of their spread.  (The in-place filter reads, measured per shape, are
# plain medians: a real 0-4% of their layer, zeroing made them jump.)
SMALL_DIFFERENCES = frozenset(("l1_spill_seconds_per_byte",))


def measure_rates(hardware, *, quick: bool = False, progress=None, details=None) -> MeasuredRates:
    """Run every probe on this machine, one thread (two for the shared rates).

    Parameters
    ----------
    hardware : Hardware
        This machine's description (caches, vectors, cores): the probes size
        their buffers and pick their kernels from it.
    quick : bool
        Fewer repeats, fewer kernel shapes and layers: some seconds instead
        of about a minute (once the kernels are compiled).
    progress : callable, optional
        Called as ``progress(index, total, description, field, value,
        seconds)`` after each probe (``field`` and ``value`` None for a step
        that only prepares).
    details : dict, optional
        Filled with what the weights summarise: ``details["kernels"]`` maps
        each micro-kernel shape to its FLOP/s from L1 and the extra seconds
        per byte of its stream from L2 and from L3
        (:func:`~cso.calibrate.kernel_probes.kernel_rates`).
    """
    hardware = replace(hardware, weights=DEFAULT_WEIGHTS)
    # First whether the kernels' software prefetch pays: the probes through
    # the loop nests then run the kernels as this machine's plans will.
    started = time.perf_counter()
    with kept_openmp_threads():
        speedup = prefetch_probe.prefetch_speedup(hardware, 3 if quick else 7)
    distance = kernel_prefetch_distance(speedup, hardware.kernel_prefetch_distance)
    hardware = replace(hardware, kernel_prefetch_distance=distance)
    steps, state = calibration_steps(hardware, quick)
    steps[0:0] = [("prefetch_speedup", "loop nests with the kernels' software prefetch "
                   "against without", lambda: speedup)]  # fmt: skip
    # A difference of two times or a slope moves by more than either time:
    # each such figure is the median of several measurements.
    again = 1 if quick else 5
    steps = [
        (
            field,
            description,
            median_of(probe, again, difference=field in SMALL_DIFFERENCES)
            if field in REPEATED
            else probe,
        )
        for field, description, probe in steps
    ]
    values = {}
    with kept_openmp_threads():
        for index, (field, description, probe) in enumerate(steps, 1):
            if index > 1:  # the first, the prefetch's, was timed above
                started = time.perf_counter()
            value = probe()
            if field is not None:
                values[field] = state[field] = float(value)
            if progress is not None:
                shown = values.get(field) if field is not None else None
                elapsed = time.perf_counter() - started
                progress(index, len(steps), description, field, shown, elapsed)
    if details is not None:
        details["kernels"] = state["kernels"]
    # Each shape's own rate from L1 (its mac cost); --quick measures fewer shapes.
    values["kernel_shape_flops"] = {
        name: max(rate[0], state["best_resident"].get(name, 0.0))
        for name, rate in state["kernels"].items()
    }
    values["in_place_shape_seconds"] = state["in_place"]
    values["input_pack_kind_seconds"] = state["input_pack"]
    values["loop_shape_seconds"] = state["loop_shapes"]
    values["loop_pointwise_shape_seconds"] = state["loop_pointwise_shapes"]
    values["input_pack_width_seconds"] = state["input_pack_width"]
    values["in_place_pointwise_shape_seconds"] = state["pointwise_in_place"]
    return MeasuredRates(**values)
