"""``python -m cso calibrate [--quick] [--output PATH] [--no-save]``.

Measures this machine (:func:`cso.calibrate.measure_rates`), printing each
probe as it finishes, then the measured rates and the weights derived from
them beside the defaults, and stores the rates for this machine
(:mod:`cso.analysis.calibration_store`), where :func:`cso.conv2d`,
:func:`cso.plan_conv2d`, :func:`cso.tune` and ``explain`` find them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import fields

from ..analysis import calibration, calibration_store
from ..analysis.detect import stored_or_probed
from ..analysis.weights import DEFAULT_WEIGHTS, SHAPE_TABLES, TABLE_LABELS, TABLE_WEIGHTS
from . import measure_rates

_UNITS = {
    "flops": (1e9, "GFLOP/s"),
    "bytes_per_second": (1e9, "GB/s"),
    "seconds_per_byte": (1e-12, "ps/byte"),
    "seconds": (1e-9, "ns"),
}


# Each per-shape (or per-kind) table of the measured rates, as its rows are labelled.
RATE_TABLE_LABELS = {
    "in_place_shape_seconds": "in place, ",
    "in_place_pointwise_shape_seconds": "in place, 1x1, ",
    "input_pack_kind_seconds": "packing, ",
    "loop_shape_seconds": "in the loop, ",
    "loop_pointwise_shape_seconds": "in the loop, 1x1, ",
    "input_pack_width_seconds": "packing, ",
}


def _shown(name: str, value: float) -> str:
    for suffix, (scale, unit) in _UNITS.items():
        if name.endswith(suffix):
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g}"


def _progress(stream):
    def report(index, total, description, field, value, seconds):
        shown = "" if value is None else f": {_shown(field, value)}"
        print(f"[{index:>2}/{total}] {description}{shown} ({seconds:.1f} s)", file=stream,
              flush=True)  # fmt: skip

    return report


def weights_table(weights) -> str:
    """The derived weights beside the defaults, one per line."""
    lines = [f"{'weight':<24} {'calibrated':>12} {'default':>12} {'ratio':>7}"]
    for field in fields(weights):
        if field.name == "origin" or field.name in SHAPE_TABLES:
            continue
        new, old = getattr(weights, field.name), getattr(DEFAULT_WEIGHTS, field.name)
        measured = "" if field.name in calibration.CALIBRATED_WEIGHTS else "  (a share, kept)"
        ratio = f"{new / old:7.2f}" if old else "      -"
        lines.append(f"{field.name:<24} {new:>12.4g} {old:>12.4g} {ratio}{measured}")
    for table, weight in TABLE_WEIGHTS.items():
        old = getattr(DEFAULT_WEIGHTS, weight)
        label = TABLE_LABELS[table]
        for shape, cost in getattr(weights, table):
            ratio = f"{cost / old:7.2f}" if old else "      -"
            lines.append(f"{label + ' ' + shape:<24} {cost:>12.4g} {old:>12.4g} {ratio}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cso calibrate",
        description="Measure this machine's rates and derive the cost model's weights from them.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats, shapes and layers: seconds instead of about a minute",
    )
    parser.add_argument(
        "--output", type=pathlib.Path, help="also write the calibration record to this JSON file"
    )
    parser.add_argument("--no-save", action="store_true",
                        help="do not store it as this machine's calibration")  # fmt: skip
    args = parser.parse_args(argv)
    if args.output is not None and args.output.is_dir():
        parser.error(f"--output must be a file path, got the directory {args.output}")
    hardware = stored_or_probed()
    key = calibration_store.calibration_key(hardware.cores)
    print(
        f"calibrating {key}: L1 {hardware.l1_bytes >> 10} KiB ({hardware.l1_ways}-way), "
        f"L2 {hardware.l2_bytes >> 10} KiB, L3 {hardware.l3_bytes >> 20} MiB, "
        f"{hardware.vector_bytes * 8}-bit vectors" + (" (quick)" if args.quick else ""),
        file=sys.stderr,
    )
    started = time.perf_counter()
    details = {}
    rates = measure_rates(
        hardware, quick=args.quick, progress=_progress(sys.stderr), details=details
    )
    seconds = time.perf_counter() - started
    weights = calibration.derive_weights(rates)
    record = calibration_store.calibration_record(rates, key, quick=args.quick, seconds=seconds)
    print(f"\nmeasured rates ({seconds:.1f} s)")
    for name, value in rates.to_dict().items():
        if name in RATE_TABLE_LABELS:
            what = RATE_TABLE_LABELS[name]
            for shape, seconds in value.items():
                print(f"  {'  ' + what + shape:<30} {_shown(name, seconds)}")
        elif name != "kernel_shape_flops":  # in the micro-kernels' table below
            print(f"  {name:<30} {_shown(name, value)}")
    print("\nmicro-kernels: share of the FMA peak from L1; extra time per byte streamed")
    for name, (flops, from_l2, from_l3) in details["kernels"].items():
        print(
            f"  {name:<8} {flops / rates.fma_flops:6.1%}   from L2 {from_l2 * 1e12:6.3f} ps/byte"
            f"   from L3 {from_l3 * 1e12:6.3f} ps/byte"
        )
    print()
    print(weights_table(weights))
    distance = calibration.kernel_prefetch_distance(
        rates.prefetch_speedup, hardware.kernel_prefetch_distance
    )
    print(
        f"\nmicro-kernels' software prefetch: {distance or 'none'}"
        + (" steps ahead" if distance else "")
        + f" (the loop nests ran {rates.prefetch_speedup:.3f}x as fast with it as without;"
        f" default {hardware.kernel_prefetch_distance})"
    )
    if args.output is not None:
        args.output.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"\nwritten to {args.output}")
    if not args.no_save:
        calibration_store.save(record)
        print(f"stored as this machine's calibration in {calibration_store.store_path()}")
    return 0
