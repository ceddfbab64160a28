"""The calibration's derivations and store, with synthetic measured rates."""

from __future__ import annotations

import json
import math
import platform
import warnings

import pytest

import cso
from cso.analysis import calibration, calibration_store
from cso.analysis.calibration import MeasuredRates, beyond_tolerance, derive_weights
from cso.analysis.counts import INPUT_PACK_KINDS
from cso.analysis.weights import DEFAULT_WEIGHTS

# A made-up machine: 100 GFLOP/s FMA peak, so one unit is 1 / (2 * 100e9) s = 5 ps.
RATES = dict(
    fma_flops=100e9,
    kernel_flops=80e9,
    l2_stream_seconds_per_byte=2.5e-12,
    l3_bytes_per_second=40e9,
    dram_bytes_per_second=10e9,
    l3_shared_bytes_per_second=20e9,
    dram_shared_bytes_per_second=5e9,
    l1_spill_seconds_per_byte=1e-11,
    l2_line_reload_seconds=6.5e-10,
    tlb_miss_seconds=2e-9,
    kernel_call_seconds=1e-7,
    transposed_store_seconds=1e-10,
    input_pack_seconds=5e-10,
    filter_pack_seconds=1.5e-9,
    in_place_filter_seconds=3e-11,
    in_place_input_seconds=2e-11,
    tap_call_seconds=7.5e-9,
    tap_load_seconds=4e-10,
    lane_transpose_seconds=3.5e-10,
    filter_pack_shared_seconds=3e-9,
    filter_pack_call_seconds=6e-5,
    filter_pack_call_elements=20000.0,
    filter_tile_pack_seconds=1e-9,
    row_call_seconds=2e-8,
    plane_call_seconds=1.5e-8,
    row_column_seconds=1.2e-8,
    row_column_macs=168.0,
    row_column_loads=40.0,
    plane_column_seconds=1.6e-8,
    plane_column_macs=80.0,
    plane_column_loads=56.0,
    row_wide_call_seconds=1.5e-8,
    row_calls_per_plane=1.0,
    row_wide_calls_per_plane=2.0,
    tap_nest_call_seconds=1e-8,
)
UNIT = 5e-12
# A call's intercept is t_call + t_job / n on planes of n calls: 20 ns with
# one call a plane, 15 ns with two: 10 ns a plane and 10 a call.
ROW_JOB = (2e-8 - 1.5e-8) / (1.0 - 1.0 / 2)


def test_each_weight_is_its_formula_of_the_rates():
    weights = derive_weights(MeasuredRates(**RATES))
    assert calibration.unit_seconds(100e9) == pytest.approx(UNIT)
    expected = {
        "mac_cost": 4 * 100e9 / 80e9,  # 5.0: the kernels reach 80% of the peak
        "l2_cost": 2.5e-12 / UNIT,  # 0.5 (no loop-nest shape timings in RATES)
        "l3_cost": (1 / 40e9) / UNIT,  # 5.0
        "dram_cost": (1 / 10e9) / UNIT,  # 20
        "l3_shared_cost": (1 / 20e9) / UNIT,  # 10
        "dram_shared_cost": (1 / 5e9) / UNIT,  # 40
        "l1_miss_cost": 1e-11 / UNIT,  # 2.0
        "l1_conflict_cost": 6.5e-10 / UNIT,  # 130 per conflicting filter read
        "tlb_miss_cost": 2e-9 / UNIT,  # 400
        "call_cost": 1e-7 / UNIT,  # 20000
        "transposed_store_cost": 1e-10 / UNIT,  # 20
        "input_pack_cost": 5e-10 / UNIT,  # 100
        "filter_pack_cost": 1.5e-9 / UNIT,  # 300
        "filter_pack_shared_cost": 3e-9 / UNIT,  # 600 of thread time, workers reading every panel
        "filter_tile_pack_cost": 1e-9 / UNIT,  # 200, packed tile by tile in the loop nest
        # 60 us a call for 20,000 elements, 30 of them at 1.5 ns: 30 us fixed.
        "filter_pack_call_cost": (6e-5 - 20000 * 1.5e-9) / UNIT,  # 6,000,000 a call
        "in_place_filter_cost": 3e-11 / UNIT,  # 6
        "in_place_input_cost": 2e-11 / UNIT,  # 4 per input element read in place
        "tap_call_cost": 7.5e-9 / UNIT,  # 1500
        "tap_load_cost": 4e-10 / UNIT,  # 80 per input vector loaded
        "lane_transpose_cost": 3.5e-10 / UNIT,  # 70 per element transposed
        "row_call_cost": (1.5e-8 - ROW_JOB / 2) / UNIT,  # 2000 per row-kernel call
        "row_job_cost": ROW_JOB / UNIT,  # 2000 per plane of the row nest
        "tap_nest_call_cost": 1e-8 / UNIT,  # 2000 per tap-kernel call in its nest
        "plane_call_cost": 1.5e-8 / UNIT,  # 3000 per plane-kernel call in its nest
        # A column of taps adds 2400 units to a row call: 168 multiply-adds at the
        # mac_cost of 5.0 take 840, the other 1560 over its 40 loads is 39 a load.
        "unpacked_load_cost": (1.2e-8 / UNIT - 168 * 5.0) / 40,
        # The plane nest's column: 3200 units, 80 multiply-adds take 400, the
        # other 2800 over its 56 loads is 50 a load.
        "plane_load_cost": (1.6e-8 / UNIT - 80 * 5.0) / 56,
    }
    assert set(expected) == set(calibration.CALIBRATED_WEIGHTS)
    for name, value in expected.items():
        assert getattr(weights, name) == pytest.approx(value, rel=1e-9), name
    # The shares are not rates of the machine: they keep their defaults.
    assert weights.sweep_fraction == DEFAULT_WEIGHTS.sweep_fraction
    assert weights.stream_overlap == DEFAULT_WEIGHTS.stream_overlap
    assert weights.origin == "calibrated" and DEFAULT_WEIGHTS.origin == "defaults"


def test_plane_loads_fall_back_to_the_row_kernels_where_not_measured():
    from dataclasses import replace

    from cso.analysis.planes import plane_traffic
    from cso.geometry import make_geometry

    from conftest import AVX512_CORE

    # A 7x7 plane of 3x3 filters: one whole-plane call (32 registers hold its
    # weights), the kernel whose loads the calibration's plane probe measures.
    geometry = make_geometry((1, 64, 7, 7), (64, 1, 3, 3), padding=1, groups=64)
    older = dict(RATES, plane_column_seconds=0.0, plane_column_macs=0.0, plane_column_loads=0.0)
    assert derive_weights(MeasuredRates(**older)).plane_load_cost == 0.0
    weights = derive_weights(MeasuredRates(**RATES))
    assert weights.plane_load_cost != weights.unpacked_load_cost

    def cost(**changed):
        hardware = replace(AVX512_CORE, weights=replace(weights, **changed))
        return plane_traffic(geometry, hardware, 4, 1).cost

    own = weights.plane_load_cost
    # The plane kernel's loads are priced at its own rate, whatever the row kernel's ...
    assert cost() == pytest.approx(cost(unpacked_load_cost=2 * own + 1.0))
    # ... and at the row kernel's where its own was not measured (0).
    assert cost() == pytest.approx(cost(plane_load_cost=0.0, unpacked_load_cost=own))
    assert cost(plane_load_cost=0.0) != pytest.approx(cost())
    # Planes too large for one call take the one-row tap kernel's rate, not
    # the probe's: their kernel loads each tap unaligned beside its FMA.
    wide = make_geometry((1, 64, 56, 56), (64, 1, 3, 3), padding=1, groups=64)
    hardware = replace(AVX512_CORE, weights=weights)
    priced = plane_traffic(wide, hardware, 4, 1).cost
    hardware = replace(AVX512_CORE, weights=replace(weights, plane_load_cost=2 * own + 1.0))
    assert plane_traffic(wide, hardware, 4, 1).cost == pytest.approx(priced)
    dearer = replace(weights, tap_load_cost=weights.tap_load_cost + 100.0)
    hardware = replace(AVX512_CORE, weights=dearer)
    assert plane_traffic(wide, hardware, 4, 1).cost > priced


def test_unpacked_loads_fall_back_to_the_tap_kernel_where_not_measured():
    from cso.analysis.depthwise import tap_kernel_cost

    older = dict(RATES, row_column_seconds=0.0, row_column_macs=0.0, row_column_loads=0.0)
    weights = derive_weights(MeasuredRates(**older))
    assert weights.unpacked_load_cost == 0.0
    # 0 stands for "not measured": the tap kernel's load less an FMA's 8 lanes.
    fallback = weights.tap_load_cost - weights.mac_cost * 32 / 4
    by_default = tap_kernel_cost(weights, 4, 1, 0, 10, 32, call_cost=0.0, load_cost=0.0)
    assert by_default == pytest.approx(10 * fallback)
    measured = tap_kernel_cost(weights, 4, 1, 0, 10, 32, call_cost=0.0, load_cost=39.0)
    assert measured == pytest.approx(390.0)


def test_weights_keep_two_significant_figures():
    rates = MeasuredRates(**dict(RATES, kernel_call_seconds=1.234e-7, tlb_miss_seconds=0.0))
    weights = derive_weights(rates)
    assert weights.call_cost == 25000.0  # 24680 units
    assert weights.tlb_miss_cost == 0.0
    assert calibration.rounded(1.23456) == 1.2
    assert calibration.rounded(987.6) == 990.0
    # Below a hundredth of a multiply-add, a weight is noise: 0.
    assert calibration.rounded(0.0067) == 0.0 and calibration.rounded(0.05) == 0.05


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("fma_flops", 0.0, ValueError),
        ("l3_bytes_per_second", -1.0, ValueError),
        ("tlb_miss_seconds", math.nan, ValueError),
        ("kernel_call_seconds", math.inf, ValueError),
        ("input_pack_seconds", True, TypeError),
        ("filter_pack_seconds", "1e-9", TypeError),
    ],
)
def test_bad_rates_are_refused_by_name(name, value, error):
    with pytest.raises(error, match=name):
        MeasuredRates(**dict(RATES, **{name: value}))


def test_unknown_or_missing_rates_are_refused():
    with pytest.raises(TypeError):
        MeasuredRates.from_dict(dict(RATES, surprise=1.0))
    with pytest.raises(TypeError):
        MeasuredRates.from_dict({k: v for k, v in RATES.items() if k != "fma_flops"})


def test_changing_a_weight_by_hand_marks_the_weights_as_the_users():
    hardware = cso.Hardware().with_changes(call_cost=1.0)
    assert hardware.weights.origin == "user" and hardware.weights.call_cost == 1.0
    with pytest.raises(TypeError, match="origin"):
        cso.CostWeights(origin=3)


@pytest.fixture
def store(monkeypatch, tmp_path):
    monkeypatch.setenv("CSO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CSO_CALIBRATION", raising=False)
    return tmp_path


def _record(key, **changes):
    return calibration_store.calibration_record(
        MeasuredRates(**dict(RATES, **changes)), key, quick=False, seconds=1.0
    )


def test_stored_calibration_is_found_by_its_key_and_rederived(store):
    hardware = cso.Hardware(cores=2)
    key = calibration_store.calibration_key(2)
    calibration_store.save(_record(key))
    calibrated = calibration_store.apply_calibration(hardware, environment={})
    assert calibrated.weights == derive_weights(MeasuredRates(**RATES))
    assert calibrated.source.endswith("+calibrated")
    assert "calibrated on this machine" in cso.explain(
        cso.plan_conv2d((1, 16, 8, 8), (16, 16, 3, 3), hardware=calibrated, threads=1)
    )
    # Another core count (or CPU, or cso version) is another key: not used.
    with pytest.warns(calibration_store.CalibrationWarning):
        other = calibration_store.apply_calibration(cso.Hardware(cores=4), environment={})
    assert other.weights == DEFAULT_WEIGHTS


def test_the_weights_in_the_file_are_not_trusted_only_its_rates(store):
    key = calibration_store.calibration_key(1)
    record = _record(key)
    record["weights"] = {"call_cost": 0.0}  # ignored: weights are derived again
    calibration_store.save(record)
    calibrated = calibration_store.apply_calibration(cso.Hardware(cores=1), environment={})
    assert calibrated.weights.call_cost == 20000.0


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"machines": {"K": {"format": "cso-calibration-1", "rates": {"x": 1}}}}),
        json.dumps([1, 2]),
        "{" * 100000,
    ],
)
def test_a_damaged_store_means_defaults(store, content):
    (store / calibration_store.FILE_NAME).write_text(content)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hardware = calibration_store.apply_calibration(cso.Hardware(), environment={})
    assert hardware.weights == DEFAULT_WEIGHTS


def test_defaults_are_said_once_per_machine(store):
    with pytest.warns(calibration_store.CalibrationWarning, match="python -m cso calibrate"):
        calibration_store.apply_calibration(cso.Hardware(), environment={})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibration_store.apply_calibration(cso.Hardware(), environment={})


def test_the_environment_chooses_a_file_or_the_defaults(store, tmp_path):
    chosen = tmp_path / "other.json"
    chosen.write_text(json.dumps(_record("another machine", kernel_flops=50e9)))
    hardware = calibration_store.apply_calibration(
        cso.Hardware(), environment={"CSO_CALIBRATION": str(chosen)}
    )
    assert hardware.weights.mac_cost == 8.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # off is a choice: no warning
        off = calibration_store.apply_calibration(
            cso.Hardware(), environment={"CSO_CALIBRATION": "off"}
        )
    assert off.weights == DEFAULT_WEIGHTS
    with pytest.raises(ValueError, match="CSO_CALIBRATION=.*missing.json"):
        calibration_store.apply_calibration(
            cso.Hardware(), environment={"CSO_CALIBRATION": str(tmp_path / "missing.json")}
        )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a cso calibration"):
        calibration_store.apply_calibration(
            cso.Hardware(), environment={"CSO_CALIBRATION": str(bad)}
        )


def test_committed_calibrations_are_valid():
    import pathlib

    folder = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "calibrations"
    files = sorted(folder.glob("*.json"))
    assert files, "experiments/calibrations/ holds at least this project's machines"
    for path in files:
        record = json.loads(path.read_text())
        weights = derive_weights(calibration_store.rates_from_record(record))
        assert weights.origin == "calibrated"


def test_cpu_identity_tells_apart_machines_with_one_model_name(tmp_path):
    # Two KVM guests both called "AMD EPYC": Zen 3 (AVX2) and Zen 4 (AVX-512).
    block = "processor\t: {n}\ncpu family\t: 25\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\n"
    zen3, zen4 = tmp_path / "zen3", tmp_path / "zen4"
    zen3.write_text(
        "".join(block.format(n=n, model=1) + "flags\t\t: fma avx2\n\n" for n in range(2))
    )
    zen4.write_text(block.format(n=0, model=17) + "flags\t\t: fma avx2 avx512f\n\n")
    assert calibration_store.cpu_model(zen3) == "AMD EPYC (family 25, model 1, avx2)"
    assert calibration_store.cpu_model(zen4) == "AMD EPYC (family 25, model 17, avx512f)"
    assert calibration_store.cpu_model(tmp_path / "absent") == (platform.processor() or "")


def test_each_measured_shape_gets_its_own_mac_cost():
    # The shapes' median (kernel_flops) is 80 GFLOP/s.
    rates = MeasuredRates(**RATES, kernel_shape_flops={"6x16w": 83e9, "8x8w": 70e9, "16x6f": 50e9})
    weights = derive_weights(rates)
    # 4 F / F_shape, two significant figures, for the shapes more than 5% off the median.
    assert weights.kernel_mac_costs == (("16x6f", 8.0), ("8x8w", 5.7))
    assert weights.mac_cost_of("8x8w") == 5.7
    assert weights.mac_cost_of("6x16w") == weights.mac_cost == 5.0  # within the probes' noise
    assert weights.mac_cost_of("4x24w") == 5.0  # not measured
    # A record round trip (JSON holds the table as a mapping) keeps it.
    again = MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict())))
    assert again == rates
    # A record from before the table was measured still reads: one cost for every shape.
    assert derive_weights(MeasuredRates(**RATES)).kernel_mac_costs == ()


@pytest.mark.parametrize(
    "table, error, match",
    [
        ({"8x8w": 0.0}, ValueError, "positive"),
        ({"8x8w": math.inf}, ValueError, "finite"),
        ({"8x8w": "fast"}, TypeError, "must be a number"),
        ([("8x8w",)], TypeError, "not a \\(shape, number\\) pair"),
        ("8x8w", TypeError, "pairs"),
    ],
)
def test_bad_shape_rates_are_refused_by_name(table, error, match):
    with pytest.raises(error, match=match):
        MeasuredRates(**RATES, kernel_shape_flops=table)
    with pytest.raises((TypeError, ValueError), match="kernel_mac_costs"):
        cso.CostWeights(kernel_mac_costs=table if table != {"8x8w": 0.0} else {"8x8w": -1.0})


def test_a_slow_shape_costs_its_own_rate_in_the_plan():
    # 49 windows: 8-window tiles pad 14%, 16-window ones 31%.  With one mac cost
    # the model takes 8 x 8; priced at its own, slower rate it takes 6 x 16.
    weights = derive_weights(MeasuredRates(**RATES))
    avx2 = cso.Hardware(vector_bytes=32, vector_registers=16, cores=1, weights=weights)
    shapes = dict(
        x_shape=(1, 512, 7, 7), w_shape=(512, 512, 3, 3), padding=1, threads=1, algorithm="dense"
    )
    one_rate = cso.plan_conv2d(hardware=avx2, **shapes)
    assert (one_rate.filters_per_tile, one_rate.windows_per_tile) == (8, 8)
    own_rates = avx2.with_changes(kernel_mac_costs={"8x8w": 5.0, "6x16w": 4.1})
    chosen = cso.plan_conv2d(hardware=own_rates, **shapes)
    assert (chosen.filters_per_tile, chosen.windows_per_tile) == (6, 16)
    assert "c_mac 4.1 (this shape's, calibrated)" in cso.explain(chosen)
    # Through the hardware's JSON form, as a stored description holds it.
    assert cso.Hardware.from_dict(json.loads(json.dumps(own_rates.to_dict()))) == own_rates


def test_each_measured_shape_gets_its_own_in_place_cost():
    # Per read: 8x8w 1.2e-10 s (24 units), 6x16w 3e-11 (6), 4x24w 0; the median is 6.
    seconds = {"8x8w": 1.2e-10, "6x16w": 3e-11, "4x24w": 0.0}
    rates = MeasuredRates(
        **dict(RATES, in_place_filter_seconds=3e-11), in_place_shape_seconds=seconds
    )
    weights = derive_weights(rates)
    assert weights.in_place_filter_cost == 6.0
    assert weights.kernel_in_place_costs == (("4x24w", 0.0), ("8x8w", 24.0))
    assert weights.in_place_cost_of("8x8w") == 24.0
    assert weights.in_place_cost_of("6x16w") == 6.0  # the median's
    assert weights.in_place_cost_of("4x24w") == 0.0
    assert MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    with pytest.raises(ValueError, match="in_place_shape_seconds"):
        MeasuredRates(**RATES, in_place_shape_seconds={"8x8w": -1.0})


def test_each_shape_gets_its_own_in_place_cost_on_1x1_layers():
    # Per read on the 1x1 layer: 6x16w 2e-10 s (40 units), 4x24w 5e-12 (1);
    # every measured shape listed, whatever the median.
    seconds = {"6x16w": 2e-10, "4x24w": 5e-12}
    rates = MeasuredRates(
        **dict(RATES, in_place_filter_seconds=3e-11),
        in_place_shape_seconds={"8x8w": 1.2e-10, "6x16w": 3e-11},
        in_place_pointwise_shape_seconds=seconds,
    )
    weights = derive_weights(rates)
    assert weights.pointwise_in_place_costs == (("4x24w", 1.0), ("6x16w", 40.0))
    assert weights.in_place_cost_of("6x16w", pointwise=True) == 40.0
    assert weights.in_place_cost_of("6x16w") == 6.0  # a 3x3 layer: the 3x3 figure
    # A shape not measured on the 1x1 layer costs the shared weight there.
    assert weights.in_place_cost_of("8x8w", pointwise=True) == weights.in_place_filter_cost
    assert weights.in_place_cost_of("8x8w") == 24.0
    assert MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    # Records made before it was measured: the 3x3 table serves 1x1 layers.
    older = derive_weights(MeasuredRates(**dict(RATES, in_place_filter_seconds=3e-11)))
    assert older.pointwise_in_place_costs == ()
    assert older.in_place_cost_of("6x16w", pointwise=True) == older.in_place_filter_cost
    with pytest.raises(ValueError, match="in_place_pointwise_shape_seconds"):
        MeasuredRates(**RATES, in_place_pointwise_shape_seconds={"6x16w": -1.0})


def test_a_shape_slow_in_place_on_1x1_layers_is_priced_so_there_only():
    weights = derive_weights(MeasuredRates(**dict(RATES, in_place_filter_seconds=3e-11)))
    avx2 = cso.Hardware(vector_bytes=32, vector_registers=16, cores=1, weights=weights)
    dear = avx2.with_changes(pointwise_in_place_costs={"6x16w": 40.0})
    forced = dict(filters_per_tile=6, windows_per_tile=16, vector_operand="windows", threads=1)
    pointwise = dict(x_shape=(1, 1024, 14, 14), w_shape=(256, 1024, 1, 1), **forced)
    charged = cso.plan_conv2d(hardware=dear, **pointwise)
    plain = cso.plan_conv2d(hardware=avx2, **pointwise)
    traffic = plain.cost_of(plain.schedule)
    assert traffic.in_place_filter_reads > 0
    assert charged.cost_of(plain.schedule).cost == pytest.approx(
        traffic.cost + traffic.in_place_filter_reads * (40.0 - weights.in_place_filter_cost),
        rel=1e-9,
    )
    three_by_three = dict(x_shape=(1, 128, 28, 28), w_shape=(128, 128, 3, 3), padding=1, **forced)
    assert (
        cso.plan_conv2d(hardware=dear, **three_by_three).costs
        == cso.plan_conv2d(hardware=avx2, **three_by_three).costs
    )


def test_explain_names_the_in_place_figure_a_plan_took():
    weights = derive_weights(MeasuredRates(**dict(RATES, in_place_filter_seconds=3e-11)))
    avx2 = cso.Hardware(vector_bytes=32, vector_registers=16, cores=1, weights=weights)
    priced = avx2.with_changes(
        pointwise_in_place_costs={"6x16w": 40.0}, kernel_in_place_costs={"6x16w": 2.0}
    )
    forced = dict(filters_per_tile=6, windows_per_tile=16, vector_operand="windows", threads=1)
    one_set = cso.plan_conv2d((1, 1024, 14, 14), (256, 1024, 1, 1), hardware=priced, **forced)
    assert "4096 B apart" in cso.explain(one_set)
    assert "c_in_place 40 (this shape's on 1x1 layers whose rows share an L1 set" in (
        cso.explain(one_set)
    )
    two_sets = cso.plan_conv2d((1, 512, 14, 14), (256, 512, 1, 1), hardware=priced, **forced)
    assert "c_in_place 2 (this shape's, calibrated)" in cso.explain(two_sets)
    shared = cso.plan_conv2d((1, 512, 14, 14), (256, 512, 1, 1), hardware=avx2, **forced)
    assert "(the weights' in_place_filter_cost)" in cso.explain(shared)


def test_a_shape_slow_in_place_is_priced_so():
    # The same plan problem priced with one in-place cost for every shape and
    # with the 4x24w kernel's reads free: the cost of a 4x24w plan drops by its reads.
    weights = derive_weights(MeasuredRates(**dict(RATES, in_place_filter_seconds=1.2e-10)))
    avx2 = cso.Hardware(vector_bytes=32, vector_registers=16, cores=1, weights=weights)
    free = avx2.with_changes(kernel_in_place_costs={"4x24w": 0.0})
    shapes = dict(x_shape=(1, 128, 28, 28), w_shape=(128, 128, 3, 3), padding=1, threads=1)
    forced = dict(filters_per_tile=4, windows_per_tile=24, vector_operand="windows")
    charged = cso.plan_conv2d(hardware=avx2, **shapes, **forced)
    spared = cso.plan_conv2d(hardware=free, **shapes, **forced)
    traffic = charged.cost_of(charged.schedule)
    assert traffic.in_place_filter_reads > 0
    assert spared.cost_of(spared.schedule).cost == pytest.approx(
        traffic.cost - traffic.in_place_filter_reads * weights.in_place_filter_cost, rel=1e-9
    )


def test_each_kind_of_input_packing_gets_its_own_cost():
    # Per element: shifted copies 2.5e-10 s (50 units), gathers 5e-10 (100),
    # a 1x1 layer's strided pixels 7e-10 (140); the scalar is their median.
    seconds = {"shifted": 2.5e-10, "strided": 5e-10, "pointwise_strided": 7e-10}
    rates = MeasuredRates(**RATES, input_pack_kind_seconds=seconds)
    weights = derive_weights(rates)
    assert weights.input_pack_costs == (
        ("pointwise_strided", 140.0),
        ("shifted", 50.0),
        ("strided", 100.0),
    )
    assert weights.input_pack_cost_of("shifted") == 50.0
    assert weights.input_pack_cost_of("pointwise") == weights.input_pack_cost  # not measured
    assert weights.input_pack_cost_of(None) == weights.input_pack_cost
    assert MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    with pytest.raises(ValueError, match="input_pack_kind_seconds"):
        MeasuredRates(**RATES, input_pack_kind_seconds={"shifted": -1.0})
    # A record made before the kinds were measured still reads, as one weight for all.
    assert derive_weights(MeasuredRates(**RATES)).input_pack_costs == ()


def test_input_packing_measured_at_two_widths_gets_a_per_row_term():
    # Shifted copies: 2.5e-10 s an element (50 units) at 56 output columns,
    # 1e-9 s (200 units) at 7: a + b / Q through both gives b = 150 / (1/7 -
    # 1/56) = 1200 and a = 50 - 1200 / 56 = 28.6.  Gathers measured at one
    # width keep their one figure; a narrow figure under the wide one gives
    # no row term (b = 0, a the wide figure).
    kinds = {"shifted": 2.5e-10, "strided": 5e-10, "pointwise_strided": 7e-10}
    widths = {"shifted@56": 2.5e-10, "shifted@7": 1e-9, "strided@28": 5e-10,
              "pointwise_strided@28": 7e-10, "pointwise_strided@7": 6e-10}  # fmt: skip
    rates = MeasuredRates(
        **RATES, input_pack_kind_seconds=kinds, input_pack_width_seconds=widths
    )
    weights = derive_weights(rates)
    assert dict(weights.input_pack_costs) == {
        "pointwise_strided": 140.0, "shifted": 29.0, "strided": 100.0
    }
    assert weights.input_pack_row_costs == (("pointwise_strided", 0.0), ("shifted", 1200.0))
    assert weights.input_pack_cost_of("shifted", 7) == pytest.approx(29.0 + 1200 / 7)
    assert weights.input_pack_cost_of("shifted", 56) == pytest.approx(29.0 + 1200 / 56)
    assert weights.input_pack_cost_of("shifted") == 29.0  # no width given
    assert weights.input_pack_cost_of("strided", 7) == 100.0  # one width: no row term
    assert MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    for name in ("shifted", "shifted@", "@7", "shifted@0", "shifted@x", "shifted@\u00b2"):
        with pytest.raises(ValueError, match="input_pack_width_seconds"):
            MeasuredRates(**RATES, input_pack_width_seconds={name: 1e-9})
    # Records made before it was measured: no row term.
    older = derive_weights(MeasuredRates(**RATES, input_pack_kind_seconds=kinds))
    assert older.input_pack_row_costs == ()


def test_a_layer_is_charged_its_packing_at_its_output_width():
    # 3x3 layers of 14 and 56 output columns, one plan each forced: the row
    # term adds b / Q to every packed element's cost, and explain shows it.
    weights = derive_weights(MeasuredRates(**RATES))
    flat = cso.Hardware(vector_bytes=64, vector_registers=32, cores=1, weights=weights)
    flat = flat.with_changes(input_pack_costs={"shifted": 30.0})
    rowed = flat.with_changes(input_pack_row_costs={"shifted": 1400.0})
    for width in (14, 56):
        problem = dict(x_shape=(1, 64, width, width), w_shape=(64, 64, 3, 3), padding=1,
                       threads=1, schedule="IS", filters_per_tile=14, windows_per_tile=32,
                       vector_operand="windows")  # fmt: skip
        plans = [cso.plan_conv2d(hardware=h, **problem) for h in (flat, rowed)]
        traffic = plans[0].cost_of("IS")
        assert traffic.packed_input_elements > 0
        assert plans[1].cost_of("IS").cost == pytest.approx(
            traffic.cost + traffic.packed_input_elements * 1400.0 / width, rel=1e-9
        )
        story = f"c_input {30 + 1400 / width:.3g} per element (this kind's, calibrated: 30 + "
        assert story + f"1.4e+03 / {width} output columns)" in cso.explain(plans[1])


@pytest.mark.parametrize(
    "w_shape, stride, kind",
    [
        ((64, 64, 3, 3), 1, "shifted"),
        ((64, 64, 3, 3), 2, "strided"),
        ((64, 64, 1, 1), 1, "pointwise"),
        ((64, 64, 1, 1), 2, "pointwise_strided"),
    ],
)
def test_a_layer_is_charged_its_own_kind_of_packing(w_shape, stride, kind):
    weights = derive_weights(MeasuredRates(**RATES))  # input_pack_cost 100 for every kind
    hardware = cso.Hardware(vector_bytes=64, vector_registers=32, cores=1, weights=weights)
    cheap = hardware.with_changes(input_pack_costs={kind: 10.0})
    # Every other kind made dearer: this layer's cost must not see it.
    others = {other: 1000.0 for other in INPUT_PACK_KINDS}
    others.pop(kind)
    dear_others = cheap.with_changes(input_pack_costs={kind: 10.0, **others})
    problem = dict(x_shape=(1, 64, 56, 56), w_shape=w_shape, stride=stride,
                   padding=w_shape[2] // 2, threads=1, schedule="IS",
                   filters_per_tile=14, windows_per_tile=32, vector_operand="windows")  # fmt: skip
    plans = [cso.plan_conv2d(hardware=h, **problem) for h in (hardware, cheap, dear_others)]
    traffic = plans[0].cost_of(plans[0].schedule)
    assert traffic.packed_input_elements > 0
    assert plans[1].cost_of("IS").cost == pytest.approx(
        traffic.cost - traffic.packed_input_elements * (100.0 - 10.0), rel=1e-9
    )
    assert plans[2].cost_of("IS").cost == pytest.approx(plans[1].cost_of("IS").cost, rel=1e-12)
    assert f"input packing: {kind}, c_input 10 per element (this kind's, calibrated)" in (
        cso.explain(plans[1])
    )


def test_shapes_timed_in_the_loop_nest_set_their_own_mac_costs():
    # mac_cost 5.0 (kernels at 80% of the peak from L1); per padded multiply-add
    # in the loop nest 14x32w and 8x48w take 1.0e-11 s, 8x32w 1.05e-11 (5% off the
    # median: within the tolerance), 32x14f 0.98e-11 and 16x16w 1.5e-11: the median
    # is 1.0e-11 and 16x16w, 50% off (past twice the 8% tolerance), costs
    # 5.0 * 1.50 = 7.5.
    loop = {
        "14x32w": 1.0e-11, "8x48w": 1.0e-11, "8x32w": 1.05e-11, "32x14f": 0.98e-11,
        "16x16w": 1.5e-11,
    }
    # The rates from L1 would say otherwise (all alike): the loop nest's rule.
    flat = {shape: 80e9 for shape in loop}
    rates = MeasuredRates(**RATES, kernel_shape_flops=flat, loop_shape_seconds=loop)
    weights = derive_weights(rates)
    assert weights.mac_cost == 5.0
    assert weights.kernel_mac_costs == (("16x16w", 7.5),)
    assert weights.mac_cost_of("8x32w") == 5.0
    # Continuous past the tolerance: 10% slower costs 2 * (10% - 8%) = 4% more,
    # 10% faster 4% less.
    edge = MeasuredRates(**RATES, loop_shape_seconds=dict(loop, **{"8x32w": 1.10e-11,
                                                                 "32x14f": 0.90e-11}))  # fmt: skip
    assert dict(derive_weights(edge).kernel_mac_costs) == {
        "8x32w": 5.2, "32x14f": 4.8, "16x16w": 7.5
    }
    assert [beyond_tolerance(d) for d in (0.08, 0.12, -0.12, 0.16, 0.3)] == pytest.approx(
        [0.0, 0.08, -0.08, 0.16, 0.3]
    )
    # A shape's shortfall from L1 is a floor: 8x32w at 80 / 1.16 GFLOP/s from L1
    # (16% short of the median) costs 16% more though it is 5% off in the loop
    # nest; 14x32w, faster from L1, keeps its loop nest's figure (within the
    # tolerance); so does 32x14f, 20% short from L1: a filter-vectorised
    # shape's rate from L1 includes its transposed stores, priced apart.
    floors = dict(flat, **{"8x32w": 80e9 / 1.16, "14x32w": 90e9, "32x14f": 80e9 / 1.2})
    floored = MeasuredRates(**RATES, kernel_shape_flops=floors, loop_shape_seconds=loop)
    assert dict(derive_weights(floored).kernel_mac_costs) == {"8x32w": 5.8, "16x16w": 7.5}
    # Their L2 streams are in those timings: the L2 bytes are not charged again.
    assert weights.l2_cost == 0.0
    assert derive_weights(MeasuredRates(**RATES)).l2_cost == pytest.approx(2.5e-12 / UNIT)
    assert MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    # Without loop timings (older records), the rates from L1 decide.
    assert derive_weights(MeasuredRates(**RATES, kernel_shape_flops=flat)).kernel_mac_costs == ()
    with pytest.raises(ValueError, match="loop_shape_seconds"):
        MeasuredRates(**RATES, loop_shape_seconds={"16x16w": 0.0})


def test_shapes_timed_on_a_1x1_layer_set_their_costs_there():
    # On the 3x3 layer 16x16w is 50% off the median (7.5); on the 1x1 layer it is
    # at the median and 8x32w 30% off: on 1x1 layers 16x16w costs mac_cost (5.0)
    # and 8x32w 5.0 * 1.30 = 6.5, every shape listed; elsewhere the 3x3 layer's.
    loop = {"14x32w": 1.0e-11, "8x48w": 1.0e-11, "8x32w": 1.0e-11, "16x16w": 1.5e-11}
    pointwise = {"14x32w": 1.0e-11, "8x48w": 0.99e-11, "8x32w": 1.3e-11, "16x16w": 1.0e-11}
    rates = MeasuredRates(
        **RATES, loop_shape_seconds=loop, loop_pointwise_shape_seconds=pointwise
    )
    weights = derive_weights(rates)
    assert weights.kernel_mac_costs == (("16x16w", 7.5),)
    assert dict(weights.pointwise_mac_costs) == {
        "14x32w": 5.0, "8x48w": 5.0, "8x32w": 6.5, "16x16w": 5.0
    }
    assert weights.mac_cost_of("16x16w") == 7.5
    assert weights.mac_cost_of("16x16w", pointwise=True) == 5.0
    assert weights.mac_cost_of("8x32w", pointwise=True) == 6.5
    # A shape not measured on the 1x1 layer costs mac_cost there.
    assert weights.mac_cost_of("4x64w", pointwise=True) == 5.0
    # Records without the 1x1 timings price 1x1 layers by the 3x3 layer's costs.
    older = derive_weights(MeasuredRates(**RATES, loop_shape_seconds=loop))
    assert older.pointwise_mac_costs == ()
    assert older.mac_cost_of("16x16w", pointwise=True) == 7.5
    assert MeasuredRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    with pytest.raises(ValueError, match="loop_pointwise_shape_seconds"):
        MeasuredRates(**RATES, loop_pointwise_shape_seconds={"16x16w": 0.0})


def test_records_without_the_shared_filter_packing_price_it_as_one_threads():
    # Records made before it was measured, or on one core (0): the one-thread figure.
    older = dict(RATES)
    del older["filter_pack_shared_seconds"]
    assert derive_weights(MeasuredRates(**older)).filter_pack_shared_cost == pytest.approx(
        1.5e-9 / UNIT
    )
    one_core = MeasuredRates(**dict(RATES, filter_pack_shared_seconds=0.0))
    assert derive_weights(one_core).filter_pack_shared_cost == pytest.approx(1.5e-9 / UNIT)


def test_the_fixed_part_of_packing_up_front_is_none_unmeasured_and_never_negative():
    older = dict(RATES)
    del older["filter_pack_call_seconds"], older["filter_pack_call_elements"]
    assert derive_weights(MeasuredRates(**older)).filter_pack_call_cost == 0.0
    # A call that packed faster than its elements at the per-element rate: 0, not negative.
    quick = MeasuredRates(**dict(RATES, filter_pack_call_seconds=2e-5))
    assert derive_weights(quick).filter_pack_call_cost == 0.0


def test_records_without_the_in_nest_filter_packing_price_it_as_up_front():
    older = dict(RATES)
    del older["filter_tile_pack_seconds"]
    assert derive_weights(MeasuredRates(**older)).filter_tile_pack_cost == pytest.approx(
        1.5e-9 / UNIT
    )


def test_records_without_the_wide_planes_price_the_row_nest_by_its_calls_alone():
    older = dict(RATES)
    del older["row_wide_call_seconds"], older["row_wide_calls_per_plane"]
    weights = derive_weights(MeasuredRates(**older))
    assert weights.row_call_cost == pytest.approx(2e-8 / UNIT)
    assert weights.row_job_cost == 0.0
    # Intercepts that do not fall as a plane's calls grow leave no plane cost.
    rising = derive_weights(MeasuredRates(**dict(RATES, row_wide_call_seconds=3e-8)))
    assert rising.row_job_cost == 0.0 and rising.row_call_cost == pytest.approx(2e-8 / UNIT)


def test_a_planes_own_cost_is_priced_once_a_plane_of_the_row_nest():
    from dataclasses import replace

    from conftest import AVX512_CORE

    from cso.analysis import rows
    from cso.geometry import make_geometry

    g = make_geometry((1, 32, 56, 56), (32, 1, 3, 3), padding=1, groups=32)
    hardware = replace(AVX512_CORE, weights=replace(AVX512_CORE.weights, row_job_cost=0.0))
    with_job = replace(hardware, weights=replace(hardware.weights, row_job_cost=5000.0))
    for block in (1, 4):
        base = rows.row_traffic(g, hardware, 4, 1, block)
        priced = rows.row_traffic(g, with_job, 4, 1, block)
        assert priced.cost == pytest.approx(base.cost + 5000.0)  # one plane a job


def test_the_tap_family_prices_its_calls_as_measured_in_its_nest():
    from dataclasses import replace

    from conftest import AVX512_CORE

    from cso.analysis.depthwise import depthwise_traffic
    from cso.geometry import make_geometry

    g = make_geometry((1, 32, 56, 56), (32, 1, 3, 3), padding=1, groups=32)
    weights = replace(AVX512_CORE.weights, tap_call_cost=100.0, tap_nest_call_cost=0.0)
    unmeasured = replace(AVX512_CORE, weights=weights)
    measured = replace(unmeasured, weights=replace(weights, tap_nest_call_cost=2100.0))
    before = depthwise_traffic(g, unmeasured, 4, 16, 1, rows_per_call=4)
    after = depthwise_traffic(g, measured, 4, 16, 1, rows_per_call=4)
    assert after.kernel_calls == before.kernel_calls > 0
    assert after.cost == pytest.approx(before.cost + 2000.0 * before.kernel_calls)
    # Records without it keep the kernel's own call cost.
    older = dict(RATES)
    del older["tap_nest_call_seconds"]
    assert derive_weights(MeasuredRates(**older)).tap_nest_call_cost == 0.0


def test_records_without_the_nest_call_times_price_calls_as_the_tap_kernel_does():
    older = dict(RATES)
    del older["row_call_seconds"], older["plane_call_seconds"]
    weights = derive_weights(MeasuredRates(**older))
    assert weights.row_call_cost == weights.plane_call_cost == weights.tap_call_cost
    assert weights.tap_call_cost == pytest.approx(7.5e-9 / UNIT)


def test_records_without_the_lane_transposes_price_them_as_shifted_packing():
    # Records made before the lane nest's transposes were measured: the
    # shifted input packing's cost stands in (what the lane model used), or
    # the median packing cost where no kind was measured either.
    older = dict(RATES)
    del older["lane_transpose_seconds"]
    kinds = {"shifted": 2e-10, "strided": 6e-10}
    weights = derive_weights(MeasuredRates(**older, input_pack_kind_seconds=kinds))
    assert weights.lane_transpose_cost == pytest.approx(2e-10 / UNIT)  # 40
    assert derive_weights(MeasuredRates(**older)).lane_transpose_cost == pytest.approx(
        5e-10 / UNIT
    )


@pytest.mark.parametrize(
    "l2, l3, cores, expected",
    [
        (2 << 20, 480 << 20, 2, 8 << 20),  # a VM's reported L3: four L2s, not 120 MiB
        (1 << 20, 32 << 20, 2, 4 << 20),  # Zen 4: four L2s fit half the L3's share
        (2 << 20, 105 << 20, 56, 4 << 20),  # a small share per core: still twice the L2
        (4 << 20, 40 << 20, 2, 10 << 20),  # half the share lies between two and four L2s
    ],
)
def test_the_l3_probe_reads_beyond_the_l2_and_within_a_few_of_them(l2, l3, cores, expected):
    from cso.analysis.counts import l3_resident_bytes

    assert l3_resident_bytes(l2, l3, cores) == expected


def test_median_standard_error_is_from_the_interquartile_range():
    from cso.calibrate import median_standard_error

    # Sorted 1..16: quartiles at positions 4 and 12 (values 5 and 13), n = 16.
    assert median_standard_error(list(range(16, 0, -1))) == pytest.approx(0.93 * 8 / 4)
    assert median_standard_error([3.0] * 9) == 0.0
    # Fewer than four samples: their whole range.
    assert median_standard_error([1.0, 4.0]) == pytest.approx(0.93 * 3 / 2**0.5)


def test_in_place_samples_are_taken_until_their_median_is_precise_or_capped():
    from cso.calibrate import IN_PLACE_MAX_SAMPLES, IN_PLACE_PRECISION, precise_enough

    tight = [10.0, 10.2, 9.9, 10.1, 9.8, 10.0, 10.3, 9.7, 10.0]
    assert precise_enough(tight)
    # The 8 x 48 kernel's spread on a Xeon (ps): the median of nine is not
    # known to a tenth of itself.
    wide = [3.4, 8.6, 3.0, 6.6, 13.3, 5.1, 6.8, 5.6, 16.0]
    assert not precise_enough(wide)
    # The same spread, three times the samples: the standard error shrinks
    # by sqrt(3) to 0.63, under a tenth of the median (0.66), before the cap.
    assert not precise_enough(wide * 2)
    assert precise_enough(wide * 3) and len(wide * 3) < IN_PLACE_MAX_SAMPLES
    assert IN_PLACE_PRECISION == 0.1
    # Samples that never settle stop at the cap.
    assert precise_enough([0.0, 100.0] * (IN_PLACE_MAX_SAMPLES // 2))
    assert not precise_enough([0.0, 100.0] * (IN_PLACE_MAX_SAMPLES // 2 - 1))


def test_the_steps_measure_every_scalar_rate_once():
    """Every scalar of MeasuredRates has one step (the tables are assembled
    from the passes' samples; the prefetch's, measured first, is put before
    them by measure_rates), and the read bandwidths are the four kept as
    the best of their passes (built without running a probe)."""
    from dataclasses import fields

    from cso.analysis.detect import stored_or_probed
    from cso.analysis.rates import MeasuredRates
    from cso.calibrate import memory_probes
    from cso.calibrate.steps import calibration_steps

    hardware = stored_or_probed()
    tables = {"kernel_shape_flops", "in_place_shape_seconds", "input_pack_kind_seconds",
              "loop_shape_seconds", "loop_pointwise_shape_seconds", "input_pack_width_seconds",
              "in_place_pointwise_shape_seconds"}  # fmt: skip
    scalars = {f.name for f in fields(MeasuredRates)} - tables - {"prefetch_speedup"}
    for quick in (False, True):
        steps, _ = calibration_steps(hardware, quick)
        named = [field for field, _, _ in steps if field is not None]
        assert sorted(named) == sorted(scalars)
    bandwidths = memory_probes.bandwidth_probes(2, 1 << 20, 64 << 20, 3)
    assert set(bandwidths) <= scalars
    assert {name for name in bandwidths if "bytes_per_second" in name} == set(bandwidths)
    assert len(bandwidths) == 4


def test_the_prefetch_is_kept_unless_the_nests_ran_faster_without():
    from cso.analysis.calibration import kernel_prefetch_distance

    def rates(speedup):
        return MeasuredRates(**RATES, prefetch_speedup=speedup)

    assert kernel_prefetch_distance(rates(0.0).prefetch_speedup, 16) == 16  # not measured
    assert kernel_prefetch_distance(rates(1.03).prefetch_speedup, 16) == 16
    assert kernel_prefetch_distance(rates(0.97).prefetch_speedup, 16) == 0
    assert kernel_prefetch_distance(rates(0.999).prefetch_speedup, 12) == 0
    with pytest.raises(ValueError, match="prefetch_speedup"):
        rates(-0.5)


def test_the_calibrate_command_labels_every_table_of_the_rates():
    # Each per-shape table prints row by row (a dict has no number format).
    from dataclasses import fields

    from cso.calibrate.cli import RATE_TABLE_LABELS

    tables = {f.name for f in fields(MeasuredRates) if f.type == "tuple"}
    assert tables - {"kernel_shape_flops"} == set(RATE_TABLE_LABELS)
