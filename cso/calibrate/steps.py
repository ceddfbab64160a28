"""The calibration's steps, in the order they run: :func:`calibration_steps`.

Each step is ``(rate name or None, description, probe)``; a step without a
name prepares what later ones report (a pass of samples spread over the
calibration, whose best or median a later step keeps).  :mod:`cso.calibrate`
runs them (:func:`~cso.calibrate.measure_rates`).
"""

from __future__ import annotations

from statistics import median

from ..analysis.counts import l3_resident_bytes
from ..analysis.rates import width_name
from ..analysis.tiles import conflict_probe_shape
from ..analysis.shape_tables import kernel_shape_key
from ..microkernels.peak import fma_peak_gflops
from . import in_place_probes, kernel_probes, loop_probes, memory_probes
from .timing import precise_enough


def calibration_steps(hardware, quick: bool):
    """``[(field or None, description, probe)]``, in the order they run."""
    lanes = hardware.vector_bytes // 4
    repeats = 3 if quick else 7
    rounds = 3 if quick else 7
    all_shapes = kernel_probes.planner_shapes(hardware.vector_bytes, hardware.vector_registers)
    shapes = all_shapes
    if quick:
        shapes = shapes[:1] + [s for s in shapes if s[2] == "filters"][:1]
    l3_size = l3_resident_bytes(hardware.l2_bytes, hardware.l3_bytes, hardware.cores)
    dram_size = max(64 << 20, (2 if quick else 4) * hardware.l3_bytes)
    state = {}

    def kernels():
        state["kernels"] = kernel_probes.kernel_rates(
            shapes, lanes, hardware.l1_bytes, hardware.l2_bytes, repeats
        )
        resident_medians.append(kernel_probes.summary(state["kernels"])[0])
        return state["kernels"]

    def taps():
        # A slope and an intercept: the median of several fits, each figure apart.
        fits = [kernel_probes.tap_seconds(lanes, repeats=repeats) for _ in range(1 if quick else 5)]
        state["taps"] = tuple(median(fit[i] for fit in fits) for i in range(2))
        return state["taps"]

    def row_nest():
        # An intercept and a slope, as the taps': the median of several, each
        # apart; and the intercept on wide planes, whose calls share a plane's
        # own work (calibration.row_job_cost tells the two apart).
        narrow, wide = [], []
        for _ in range(1 if quick else 5):
            narrow.append(loop_probes.unpacked_nest_seconds(hardware, "depthwise_rows", rounds))
            wide.append(
                loop_probes.unpacked_nest_seconds(
                    hardware, "depthwise_rows", rounds, layer=loop_probes.WIDE_ROW_LAYER
                )
            )
        state["rows"] = tuple(median(fit[i] for fit in narrow) for i in range(5))
        state["wide_rows"] = tuple(median(fit[i] for fit in wide) for i in range(5))
        return state["rows"]

    def plane_nest():
        # The plane nest's intercept and slope, each the median of several
        # fits, as the row nest's.
        fits = [
            loop_probes.unpacked_nest_seconds(hardware, "depthwise_planes", rounds)
            for _ in range(1 if quick else 5)
        ]
        state["planes"] = tuple(median(fit[i] for fit in fits) for i in range(4))
        return state["planes"]

    def column_fit_steps(kernel: str, key: str) -> list:
        """The steps reporting ``state[key]``, a depthwise nest's fit against
        its column taps: ``<kernel>_call_seconds`` (the intercept) and the
        column's seconds, multiply-adds and loads."""
        return [
            (f"{kernel}_call_seconds", f"depthwise {kernel}-kernel call in its loop nest",
             lambda: state[key][0]),
            (f"{kernel}_column_seconds",
             f"depthwise {kernel}-kernel column of taps in its loop nest", lambda: state[key][1]),
            (f"{kernel}_column_macs",
             f"multiply-adds a column of taps adds to a {kernel}-kernel call",
             lambda: state[key][2]),
            (f"{kernel}_column_loads",
             f"vector loads a column of taps adds to a {kernel}-kernel call",
             lambda: state[key][3]),
        ]  # fmt: skip

    in_place_passes = 1 if quick else 3
    in_place_samples = {}
    pointwise_in_place_samples = {}

    def in_place_pass(last: bool):
        # Per shape, the median of nine differences, each a few percent of
        # its layer (in_place_probes.in_place_filter_seconds), taken in three
        # passes spread over the calibration: the figures drift with the
        # machine's state over minutes, not with sampling (medians of 25
        # moved as much as medians of 9: 14x32w 5.8-10 units over three
        # calibrations on a Xeon), so samples from a few seconds apart
        # shared one state.  On a Xeon, five calibrations so read 8x48w at
        # 4.1-5.5 ps and 14x32w at 13.9-16.3, and planned ResNet-50 and
        # VGG-16 97.1-100% alike over their ten pairs; five with the nine
        # taken at once read 5.1-12 and 15-22 ps, and 90.0-100% alike.  The
        # last pass then samples a shape on until its median is precise enough
        # (precise_enough): the nine are too few for the 8 x 48 kernel's.
        def run():
            for nf, nwin in in_place_probes.in_place_shapes(hardware):
                samples = in_place_samples.setdefault(kernel_shape_key(nf, nwin, "windows"), [])
                for _ in range(1 if quick else 3):
                    seconds = in_place_probes.in_place_filter_seconds(hardware, (nf, nwin), rounds)
                    samples.append(seconds)
                while last and not quick and not precise_enough(samples):
                    seconds = in_place_probes.in_place_filter_seconds(hardware, (nf, nwin), rounds)
                    samples.append(seconds)
                # And on a 1x1 layer, whose rows lie 4 KiB apart: a difference
                # several times the 3x3 layer's, so the passes' samples serve.
                samples = pointwise_in_place_samples.setdefault(
                    kernel_shape_key(nf, nwin, "windows"), []
                )
                for _ in range(1 if quick else 3):
                    samples.append(
                        in_place_probes.in_place_filter_seconds(
                            hardware, (nf, nwin), rounds,
                            layer=in_place_probes.POINTWISE_IN_PLACE_LAYER,
                        )  # fmt: skip
                    )
            if last:
                state["in_place"] = {key: median(v) for key, v in in_place_samples.items()}
                state["pointwise_in_place"] = {
                    key: median(v) for key, v in pointwise_in_place_samples.items()
                }
                return state["in_place"]
            return None

        return run

    resident_medians = []
    # Each shape's best rate from L1 over the passes: its own mac cost's
    # floor (calibration_tables.shape_deviation).  The machine's other tenants
    # only ever slow a kernel, and they come and go over seconds: on a shared
    # EPYC (Zen 3) one pass read 4x24w at 71.5 GFLOP/s and the next
    # calibration's at 89.8, and that one figure moved 30 of ResNet-50's and
    # VGG-16's 70 plans.
    best_resident = state["best_resident"] = {}

    def resident_pass():
        # The shapes' median rate from L1, again: kernel_flops is the median
        # of three such passes spread over the calibration (one when quick).
        # The FMA peak holds still (240-243 GFLOP/s on a shared Xeon, four
        # processes a minute) while the kernels, which load from L1, move
        # with the machine's other tenants: medians of 207-230 GFLOP/s in
        # those processes, and 208 in one of five calibrations against
        # 229-230, whose mac_cost (4.7 against 4.3) moved 5 of ResNet-50's
        # and VGG-16's 70 plans.
        seconds = kernel_probes.resident_seconds(shapes, lanes, rounds=3 * repeats)
        rates = {
            kernel_shape_key(*shape): kernel_probes.call_flops(shape[0], shape[1], seconds[shape])
            for shape in shapes
        }
        resident_medians.append(median(rates.values()))
        for name, rate in rates.items():
            best_resident[name] = max(best_resident.get(name, 0.0), rate)

    bandwidth_probes = memory_probes.bandwidth_probes(
        hardware.cores, l3_size, dram_size, repeats
    )
    bandwidth_samples = {field: [] for field in bandwidth_probes}

    def bandwidth_pass():
        # The bandwidths as the kernels' rates: the best of samples spread
        # over the calibration (the median of five taken at once before).
        # Other tenants only ever take bandwidth away, for a minute or so:
        # on a shared EPYC (Zen 3) five calibrations read the L3 per core
        # with both cores streaming at 22.7-23.4 or 31.7-33.5 GB/s, and the
        # lower figure moved 4 of ResNet-50's and VGG-16's 70 plans.
        for field, probe in bandwidth_probes.items():
            bandwidth_samples[field].append(probe())

    def kept(samples, probe, keep, count=1):
        """A step that adds ``count`` samples of ``probe`` to those the
        passes took and reports ``keep`` of them all."""

        def run():
            samples.extend(probe() for _ in range(count))
            return keep(samples)

        return run

    def best_bandwidth(field):
        return kept(bandwidth_samples[field], bandwidth_probes[field], max)

    # The filters' packing times, plain times per element, and the kernel
    # calls' times: each the quickest of samples spread over the passes, as
    # the bandwidths' best.  Taken at once, the tile-by-tile packing read
    # 1.40 and 2.23 units in two calibrations a minute apart on a shared EPYC
    # (Zen 3), and moved 6 of ResNet-50's and VGG-16's 70 plans.
    filter_pack_probes = {
        "filter_pack_seconds": lambda: loop_probes.filter_pack_seconds(hardware, rounds),
        "filter_tile_pack_seconds": lambda: loop_probes.filter_tile_pack_seconds(
            hardware, rounds
        ),
    }
    filter_pack_samples = {field: [] for field in filter_pack_probes}

    def call_probe():
        return loop_probes.kernel_call_times(hardware, rounds)

    call_samples = []

    def filter_pack_pass():
        for field, probe in filter_pack_probes.items():
            filter_pack_samples[field].append(probe())
        call_samples.append(call_probe())

    # And a few more samples at the step itself (the passes' are one each).
    final_samples = 1 if quick else 3
    kernel_call_seconds = kept(
        call_samples, call_probe, loop_probes.kernel_call_seconds, final_samples
    )

    def quickest_filter_pack(field):
        return kept(filter_pack_samples[field], filter_pack_probes[field], min, final_samples)

    def kernel_flops():
        return median(resident_medians)

    def early_pass(index: int) -> list:
        """The earlier pass ``index`` (in-place reads, the rates from L1, the
        bandwidths, filter packing, the loop-nest timings and input
        packing) as steps (none when quick)."""
        if index >= in_place_passes:
            return []
        description = "filter elements read in place, per window-vectorised shape"
        description += f" ({index}/{in_place_passes})"
        return [
            (None, description, in_place_pass(False)),
            (None, f"micro-kernel rates from L1 ({index + 1}/{in_place_passes})", resident_pass),
            (None, f"read bandwidths ({index}/{in_place_passes})", bandwidth_pass),
            (None, f"filter packing and kernel calls ({index}/{in_place_passes})",
             filter_pack_pass),
            (None, f"micro-kernels in the loop nest and input packing ({index}/{in_place_passes})",
             loop_and_packing_pass(False)),
        ]  # fmt: skip

    # The figures below come from samples taken in the passes spread over
    # the calibration (one pass when quick), not all at once: on a shared
    # EPYC (Zen 3) one calibration's input packing read 1.5-1.75x the
    # others' (a busy minute of the memory), and its plans matched the
    # others' on 87-90% of ResNet-50's and VGG-16's layers.
    loop_layers = {
        "loop_shapes": loop_probes.SHAPE_LAYER,
        "loop_pointwise_shapes": loop_probes.POINTWISE_SHAPE_LAYER,
    }
    loop_runs = {name: [] for name in loop_layers}
    pack_kinds = loop_probes.PACK_LAYERS
    if quick:
        pack_kinds = {kind: pack_kinds[kind] for kind in ("shifted",)}
    # Each kind on its layer, and the kinds whose cost grows as the rows
    # shorten on a narrow one too, keyed "<kind>@<output columns>".
    def width_key(kind, layer):
        return width_name(kind, loop_probes.output_columns(layer))

    kind_keys = {kind: width_key(kind, layer) for kind, layer in pack_kinds.items()}
    pack_layers = {
        width_key(kind, layer): layer
        for layers in (pack_kinds, {} if quick else loop_probes.NARROW_PACK_LAYERS)
        for kind, layer in layers.items()
    }
    pack_samples = {name: [] for name in pack_layers}

    def loop_and_packing_pass(last: bool):
        # Per shape, one timing in the loop nest on each layer; per kind of
        # input packing, two differences (one when quick).
        def run():
            for name, layer in loop_layers.items():
                loop_runs[name].append(
                    loop_probes.loop_shape_seconds(hardware, shapes, rounds, layer)
                )
            for name, layer in pack_layers.items():
                for _ in range(1 if quick else 2):
                    pack_samples[name].append(
                        loop_probes.input_pack_times(hardware, layer, rounds)
                    )
            if not last:
                return None
            # Each shape's quickest pass (as with the rates from L1): the passes
            # share a machine state among the shapes they time, and in busy
            # ones the shapes part (6x16w 5-11% under the median on a shared
            # Zen 3, 0-1% in quiet passes), which moved 23 of ResNet-50's
            # and VGG-16's 70 plans between two calibrations' medians.
            for name, runs in loop_runs.items():
                state[name] = {key: min(run[key] for run in runs) for key in runs[0]}
            # Each kind's quickest packing over the passes, as the shapes'
            # (loop_probes.input_pack_seconds).  A layer that packs nothing
            # here is left out (its kind keeps the median's weight).
            measured = {
                name: loop_probes.input_pack_seconds(values)
                for name, values in pack_samples.items()
                if not any(value is None for value in values)
            }
            state["input_pack_width"] = measured
            state["input_pack"] = {
                kind: measured[key] for kind, key in kind_keys.items() if key in measured
            }
            return state["input_pack"]

        return run

    def line_reload():
        shape = conflict_probe_shape(
            hardware.vector_bytes, hardware.vector_registers, hardware.l1_ways
        )
        seconds = kernel_probes.l2_line_reload_seconds(
            shape, lanes, hardware.l1_bytes, hardware.l1_ways, hardware.line_bytes, repeats
        )
        if seconds is None:
            # No offered shape can overflow an L1 set here (no plan is
            # charged for it): a line priced as a spilled one.
            return state["l1_spill_seconds_per_byte"] * hardware.line_bytes
        return seconds

    return [
        ("fma_flops", "FMA peak (float32, one core)",
         lambda: fma_peak_gflops("float32", lanes, 0.05 if quick else 0.2) * 1e9),
        (None, f"micro-kernels {', '.join(f'{a}x{b}{c[0]}' for a, b, c in shapes)}: "
               "rate from L1 and with L2 and L3 streams", kernels),
        ("l2_stream_seconds_per_byte", "extra time per byte streamed from L2 (least)",
         lambda: kernel_probes.summary(state["kernels"])[1]),
        *early_pass(1),
        ("l1_spill_seconds_per_byte", "stationary tile spilled to L2, per byte",
         lambda: kernel_probes.l1_spill_seconds_per_byte(
             shapes, lanes, hardware.l1_bytes, hardware.l2_bytes, repeats)),
        ("l2_line_reload_seconds", "line reloaded from L2 (filter rows overflowing a set)",
         line_reload),
        ("tlb_miss_seconds", "first-level TLB miss",
         lambda: memory_probes.tlb_miss_seconds(
             hardware.page_bytes, hardware.line_bytes, hardware.tlb_entries, repeats)),
        ("transposed_store_seconds", "filter-vectorised write-back, per element",
         lambda: kernel_probes.transposed_store_seconds(all_shapes, lanes, repeats)),
        *early_pass(2),
        ("l3_bytes_per_second", "L3 read bandwidth, one core (best of the passes)",
         best_bandwidth("l3_bytes_per_second")),
        ("dram_bytes_per_second", "DRAM read bandwidth, one core (best of the passes)",
         best_bandwidth("dram_bytes_per_second")),
        ("l3_shared_bytes_per_second",
         f"L3 read bandwidth per core, {hardware.cores} at once (best of the passes)",
         best_bandwidth("l3_shared_bytes_per_second")),
        ("dram_shared_bytes_per_second",
         f"DRAM read bandwidth per core, {hardware.cores} at once (best of the passes)",
         best_bandwidth("dram_shared_bytes_per_second")),
        (None, "depthwise tap kernel, one row, against its column taps", taps),
        ("tap_call_seconds", "depthwise tap-kernel call", lambda: state["taps"][0]),
        ("tap_load_seconds", "depthwise tap-kernel input vector load", lambda: state["taps"][1]),
        ("lane_transpose_seconds", "element transposed by the depthwise lane nest",
         lambda: loop_probes.lane_transpose_seconds(hardware, rounds)),
        (None, "depthwise row kernel in its loop nest, against its column taps", row_nest),
        *column_fit_steps("row", "rows"),
        ("tap_nest_call_seconds", "depthwise tap-kernel call in its loop nest, 112x112 planes",
         lambda: loop_probes.unpacked_nest_seconds(
             hardware, "depthwise", rounds, layer=loop_probes.WIDE_TAP_LAYER)[0]),
        ("row_calls_per_plane", "row-kernel calls a 7x7 plane takes", lambda: state["rows"][4]),
        ("row_wide_call_seconds", "depthwise row-kernel call in its loop nest, 112x112 planes",
         lambda: state["wide_rows"][0]),
        ("row_wide_calls_per_plane", "row-kernel calls a 112x112 plane takes",
         lambda: state["wide_rows"][4]),
        (None, "depthwise plane kernel in its loop nest, against its column taps", plane_nest),
        *column_fit_steps("plane", "planes"),
        ("kernel_call_seconds", "micro-kernel call in the loop nest (quickest of the passes)",
         kernel_call_seconds),
        (None, "micro-kernels in the loop nest (a 3x3 and a 1x1 layer, per padded multiply-add) "
               "and input elements packed into panels, per kind of packing and output width "
               f"({', '.join(pack_layers)}) ({in_place_passes}/{in_place_passes})",
         loop_and_packing_pass(True)),
        ("input_pack_seconds", "input element packed into panels (median over the kinds)",
         lambda: median(state["input_pack"].values())),
        ("filter_pack_seconds", "filter element packed (quickest of the passes)",
         quickest_filter_pack("filter_pack_seconds")),
        ("filter_pack_call_seconds",
         "a small layer's filter packing as a call meets it (per call, less on filters "
         "packed ahead)",
         lambda: loop_probes.filter_pack_call_seconds(hardware, rounds)),
        ("filter_pack_call_elements", "filter elements that small layer packs",
         lambda: loop_probes.filter_pack_call_elements(hardware)),
        ("filter_pack_shared_seconds",
         f"filter element packed for {hardware.cores} workers that each read every panel",
         lambda: loop_probes.filter_pack_shared_seconds(hardware, rounds)),
        ("filter_tile_pack_seconds",
         "filter element packed tile by tile in the loop nest (quickest of the passes)",
         quickest_filter_pack("filter_tile_pack_seconds")),
        (None, f"filter elements read in place, per window-vectorised shape ({in_place_passes}/"
               f"{in_place_passes})", in_place_pass(True)),
        ("in_place_filter_seconds", "filter element read in place (median over the shapes)",
         lambda: median(state["in_place"].values())),
        ("in_place_input_seconds", "input element read in place on a 1x1 layer of small planes "
         "(median over the shapes)", lambda: median(
             in_place_probes.in_place_input_seconds(hardware, shape, rounds) for shape in shapes)),
        ("kernel_flops", "micro-kernel rate from L1 (median over the shapes and the passes)",
         kernel_flops),
    ], state  # fmt: skip
