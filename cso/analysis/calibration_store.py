"""Where calibrations are kept, and which one this machine uses.

``python -m cso calibrate`` stores the rates it measured in
``calibration.json`` in the cache directory, under a key of the CPU model,
the core count and cso's version (a new version may change what a weight
counts, so it calibrates again).  Only the measured rates are stored; the
weights are derived from them again on every reading
(:func:`~cso.analysis.calibration.derive_weights`), so a file cannot carry
weights its rates do not justify.  The file is validated before use: a
damaged, oversized or mismatched one is ignored as if absent.

Without a calibration the defaults are used and a :class:`CalibrationWarning`
says so, once per machine (a marker in the same file remembers it).
``CSO_CALIBRATION=off`` makes :func:`apply_calibration` keep the defaults,
``CSO_CALIBRATION=PATH`` reads that file (e.g. one of
``experiments/calibrations/``) instead of the stored one.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import warnings
from dataclasses import replace

from .._version import __version__
from ..cachedir import cache_directory, write_text_atomically
from ..untrusted import read_json_file
from .calibration import MeasuredRates, derive_weights, kernel_prefetch_distance

_MAX_BYTES = 256 * 1024
FILE_NAME = "calibration.json"
FORMAT = "cso-calibration-1"


class CalibrationWarning(UserWarning):
    """cso is planning with default cost weights: ``python -m cso calibrate``
    measures this machine's."""


def cpu_model(cpuinfo="/proc/cpuinfo") -> str:
    """The CPU's identity: ``/proc/cpuinfo``'s model name with its family,
    model, stepping and widest vector instruction set, or the platform's
    processor name, or ``""``.

    The model name alone does not tell machines apart: an AMD EPYC of Zen 3
    (AVX2) and one of Zen 4 (AVX-512) are both ``"AMD EPYC"`` in a KVM guest,
    and a calibration or a hardware description from one must not be taken
    for the other.
    """
    fields = {}
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor's block is enough
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        return platform.processor() or ""
    model = fields.get("model name", "") or platform.processor() or ""
    flags = set(fields.get("flags", "").split())
    isa = next((f for f in ("avx512f", "avx2", "avx", "sse2", "asimd") if f in flags), "")
    details = [
        f"{label} {fields[name]}"
        for label, name in (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))
        if fields.get(name)
    ]
    if isa:
        details.append(isa)
    return f"{model} ({', '.join(details)})" if details else model


def calibration_key(cores: int) -> str:
    """``"<CPU model>|<cores> cores|cso <version>"``: what a calibration is valid for."""
    return f"{cpu_model()}|{cores} cores|cso {__version__}"


def calibration_record(rates: MeasuredRates, key: str, *, quick: bool, seconds: float) -> dict:
    """The JSON-able record of one calibration."""
    return {
        "format": FORMAT,
        "key": key,
        "rates": rates.to_dict(),
        "quick": bool(quick),
        "seconds": round(float(seconds), 1),
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def rates_from_record(record) -> MeasuredRates:
    """The validated rates of a record.

    Raises
    ------
    ValueError
        When ``record`` is not a calibration record or its rates are malformed.
    """
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"not a cso calibration (expected format {FORMAT!r})")
    try:
        return MeasuredRates.from_dict(record.get("rates"))
    except TypeError as error:
        raise ValueError(f"malformed calibration rates: {error}") from None


def read_records(path) -> dict:
    """``{key: record}`` of the store at ``path`` (``{}`` when it is absent or unusable)."""
    try:
        stored = read_json_file(path, max_bytes=_MAX_BYTES)
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict) or not isinstance(stored.get("machines"), dict):
        return {}
    return stored


def store_path():
    return cache_directory() / FILE_NAME


def save(record: dict, path=None) -> None:
    """Add ``record`` to the store (replacing its key's earlier one), atomically."""
    path = store_path() if path is None else path
    stored = read_records(path) or {"machines": {}, "warned": []}
    stored["machines"][record["key"]] = record
    write_text_atomically(path, json.dumps(stored, indent=1, sort_keys=True))


def load_rates(key: str, environment=None) -> tuple:
    """``(rates, where)`` for ``key``: from ``CSO_CALIBRATION``'s file when set
    (whatever its key: the user chose it), else the store; ``(None, why)``
    when there is none.

    Raises
    ------
    ValueError
        When ``CSO_CALIBRATION`` names a file that is not a valid calibration.
    """
    environment = os.environ if environment is None else environment
    chosen = environment.get("CSO_CALIBRATION", "").strip()
    if chosen.lower() in ("off", "0", "none", "defaults"):
        return None, "CSO_CALIBRATION=off"
    if chosen:
        try:
            return rates_from_record(read_json_file(chosen, max_bytes=_MAX_BYTES)), chosen
        except OSError as error:
            raise ValueError(f"CSO_CALIBRATION={chosen}: cannot read it ({error})") from None
        except ValueError as error:
            raise ValueError(f"CSO_CALIBRATION={chosen}: {error}") from None
    record = read_records(store_path()).get("machines", {}).get(key)
    if record is None:
        return None, "no calibration for this machine"
    try:
        return rates_from_record(record), str(store_path())
    except ValueError:
        return None, "the stored calibration is damaged"


def apply_calibration(hardware, environment=None):
    """``hardware`` with the weights calibrated for it, or unchanged (and a
    :class:`CalibrationWarning` once per machine) when there are none."""
    key = calibration_key(hardware.cores)
    rates, where = load_rates(key, environment)
    if rates is None:
        if where != "CSO_CALIBRATION=off":  # absent or damaged: said once
            _warn_once(key)
        return hardware
    return replace(
        hardware,
        weights=derive_weights(rates),
        kernel_prefetch_distance=kernel_prefetch_distance(
            rates.prefetch_speedup, hardware.kernel_prefetch_distance
        ),
        source=f"{hardware.source}+calibrated",
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside cso: the user's call,
    however deep inside cso the planning started."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _warn_once(key: str) -> None:
    path = store_path()
    stored = read_records(path) or {"machines": {}, "warned": []}
    warned = stored.get("warned")
    if isinstance(warned, list) and key in warned:
        return
    warnings.warn(
        "cso is planning with its default cost weights, measured on another machine; "
        "run `python -m cso calibrate` (about a minute; --quick: some seconds) to measure "
        "this one's. This warning is shown once per machine.",
        CalibrationWarning,
        stacklevel=_caller_level(),
    )
    stored["warned"] = (warned if isinstance(warned, list) else []) + [key]
    try:
        write_text_atomically(path, json.dumps(stored, indent=1, sort_keys=True))
    except OSError:
        pass
