import builtins
import dataclasses

import pytest

from cso.analysis import detect
from cso.analysis.hardware import DEFAULT_HARDWARE, Hardware


def test_detect_describes_this_machine():
    machine = detect.detect_hardware()
    assert machine.l1_bytes < machine.l2_bytes <= machine.l3_bytes
    assert machine.vector_bytes in (16, 32, 64)
    assert machine.cores >= 1
    assert detect.detect_hardware() is machine  # probed once


def test_hardware_is_frozen_and_validated():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_HARDWARE.l1_bytes = 1
    with pytest.raises(ValueError, match="l2_bytes"):
        Hardware(l2_bytes=0)
    with pytest.raises(ValueError, match="usable_fraction"):
        Hardware(usable_fraction=1.5)
    assert DEFAULT_HARDWARE.with_changes(l1_bytes=4096).l1_bytes == 4096
    with pytest.raises(ValueError, match="kernel_prefetch_distance"):
        Hardware(kernel_prefetch_distance=-1)
    with pytest.raises(TypeError, match="kernel_prefetch_distance"):
        Hardware(kernel_prefetch_distance=1.5)
    # Kept through a plan's or a store's dict; older ones without it get the default.
    off = Hardware(kernel_prefetch_distance=0)
    assert Hardware.from_dict(off.to_dict()) == off
    older = {k: v for k, v in off.to_dict().items() if k != "kernel_prefetch_distance"}
    assert Hardware.from_dict(older).kernel_prefetch_distance == 16


def _fresh_detect(monkeypatch, cpuinfo_fields, sysfs_fields):
    monkeypatch.setattr(detect, "from_cpuinfo", lambda cores: dict(cpuinfo_fields))
    monkeypatch.setattr(detect, "from_sysfs", lambda: dict(sysfs_fields))
    return detect.probe()


def test_sysfs_first_then_cpuinfo(monkeypatch):
    # py-cpuinfo reports AMD EPYC's 1 MiB L2 as its L3: /sys is believed first.
    monkeypatch.setattr(detect, "flags_from_proc", lambda: [])
    machine = _fresh_detect(
        monkeypatch,
        {"l3_bytes": 1 << 20, "l2_bytes": 4 << 20, "vector_bytes": 64, "vector_registers": 32},
        {"l3_bytes": 32 << 20, "l1_bytes": 32 << 10},
    )
    assert machine.l3_bytes == 32 << 20 and machine.l1_bytes == 32 << 10
    assert machine.l2_bytes == 4 << 20 and machine.vector_bytes == 64
    assert machine.source.startswith("sysfs") and "py-cpuinfo" in machine.source


def test_an_implausible_probed_size_falls_through_to_the_next_source(monkeypatch):
    monkeypatch.setattr(detect, "flags_from_proc", lambda: [])
    machine = _fresh_detect(
        monkeypatch, {"l1_bytes": 5, "vector_registers": 10**6}, {"l1_bytes": 32 << 10}
    )
    assert machine.l1_bytes == 32 << 10
    assert machine.vector_registers == DEFAULT_HARDWARE.vector_registers


def test_defaults_when_everything_is_silent(monkeypatch):
    monkeypatch.setattr(detect, "flags_from_proc", lambda: [])
    machine = _fresh_detect(monkeypatch, {}, {})
    assert machine.l2_bytes == DEFAULT_HARDWARE.l2_bytes
    assert machine.source == "defaults"


def test_cpuinfo_absent(monkeypatch):
    real_import = builtins.__import__

    def no_cpuinfo(name, *args, **kwargs):
        if name == "cpuinfo":
            raise ImportError("py-cpuinfo is not installed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cpuinfo)
    assert detect.from_cpuinfo(2) == {}
    machine = detect.probe()
    assert "py-cpuinfo" not in machine.source
    assert machine.l1_bytes >= 1


def test_cpuinfo_silent(monkeypatch):
    import cpuinfo

    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: {})
    assert detect.from_cpuinfo(2) == {}


def test_cpuinfo_totals_are_divided_per_core(monkeypatch):
    import cpuinfo

    monkeypatch.setattr(
        cpuinfo,
        "get_cpu_info",
        lambda: {
            "count": 2,
            "l1_data_cache_size": 98304,
            "l2_cache_size": 4194304,
            "l3_cache_size": 8 << 20,
            "l2_cache_line_size": 2048,
            "flags": ["avx2", "fma"],
        },
    )
    fields = detect.from_cpuinfo(2)
    assert fields["l1_bytes"] == 49152 and fields["l2_bytes"] == 2097152
    assert fields["l3_bytes"] == 8 << 20
    assert "line_bytes" not in fields  # 2048 is not a line size
    assert (fields["vector_bytes"], fields["vector_registers"]) == (32, 16)


def test_sysfs_parser(tmp_path):
    for index, (level, kind, size) in enumerate(
        [
            (1, "Data", "48K"),
            (1, "Instruction", "32K"),
            (2, "Unified", "2048K"),
            (3, "Unified", "32M"),
        ]
    ):
        folder = tmp_path / "cpu0" / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (
            ("level", level),
            ("type", kind),
            ("size", size),
            ("coherency_line_size", 64),
            ("ways_of_associativity", 12 if kind == "Data" else 8),
        ):
            (folder / name).write_text(f"{value}\n")
    assert detect.from_sysfs(str(tmp_path)) == {
        "l1_bytes": 48 * 1024,
        "l1_ways": 12,
        "l2_bytes": 2048 * 1024,
        "l3_bytes": 32 << 20,
        "line_bytes": 64,
    }
    assert detect.from_sysfs(str(tmp_path / "missing")) == {}


def test_detection_is_stored_and_reprobed_when_stale(monkeypatch, tmp_path):
    monkeypatch.setenv("CSO_CACHE_DIR", str(tmp_path))
    probes = []

    def fake_probe():
        probes.append(1)
        return DEFAULT_HARDWARE.with_changes(l2_bytes=3 << 20, source="probe")

    monkeypatch.setattr(detect, "probe", fake_probe)
    detect.stored_or_probed.cache_clear()
    try:
        first = detect.detect_hardware()
        detect.stored_or_probed.cache_clear()
        assert detect.detect_hardware() == first and len(probes) == 1  # read back, not probed
        monkeypatch.setattr(detect, "machine_key", lambda: "another machine")
        detect.stored_or_probed.cache_clear()
        detect.detect_hardware()
        assert len(probes) == 2  # another key: probed again
        stored = (tmp_path / "hardware.json").read_text()
        assert "l2_cost" not in stored  # costs are never frozen into the store
        (tmp_path / "hardware.json").write_text("{ not json")
        detect.stored_or_probed.cache_clear()
        assert detect.detect_hardware().l2_bytes == 3 << 20 and len(probes) == 3
    finally:
        detect.stored_or_probed.cache_clear()
