"""The cost model's weights: what one unit of each counted quantity costs.

Every weight is in one unit, one byte of L1 traffic (about 1/128 of a
cycle on a core that moves 128 bytes per cycle from L1), and is only used to
compare plans, so only their ratios matter.  Each says how it was measured;
all were measured on one machine (an AVX-512 Xeon, Sapphire Rapids) and are
defaults until a calibration measures them on the machine at hand.  They
are kept apart from the machine's description (:mod:`.hardware`) and its
detection (:mod:`.detect`) so that a calibrated set can replace them whole.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .shape_tables import shape_pairs


@dataclass(frozen=True)
class CostWeights:
    """The weights of :func:`~cso.analysis.pricing.weighted_cost`.

    Parameters
    ----------
    l2_cost, l3_cost, dram_cost : float
        Relative cost of moving one byte out of each level (the unit: one
        byte of L1 traffic).  Used
        only to compare schedules, so only ratios matter.  L2 is cheap
        (0.25): the micro-kernel consumes its streamed operand at about
        10 bytes per cycle, far below what L2 delivers, so that traffic hides
        behind the FMAs.  These defaults were set by comparing the model's
        IS/WS choice with both schedules timed on ResNet-50's layers on an
        AVX-512 Xeon (experiments/schedule_choice.py): it agrees on 13 of the
        14 layers where the two differ by more than 3%.
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
    filter_pack_call_cost : float
        Fixed cost of packing a call's filter panels up front (a
        filter-vectorised plan that neither has them packed ahead nor packs
        them in its loop nest), beyond its elements at ``filter_pack_cost``:
        the Python and the dispatch around the transposes, and the first
        touches of filters and panels the layer's traffic has pushed out of
        the caches.  ``python -m cso calibrate`` times a 1x1 layer of 65,536
        filter elements per call against the same plan on filters packed
        ahead; on a Xeon (Sapphire Rapids class) the difference was 63 us
        where its elements at the per-element rate come to ~20, and unpriced
        it left two threads on 32x14f for ResNet-50's 1x1 layers at 28x28,
        1.03-1.13x slower than 8x48w, and as close as 0.4% to it in the
        model, so that calibrations took either.  Charged as wall time: the
        calling thread packs while the other workers wait.  Default 0.
    filter_pack_shared_cost : float
        ``filter_pack_cost`` for a plan on more than one thread whose
        workers each read every packed panel (IS, or WS with its window
        tiles split into parts): the panels are packed in a parallel pass,
        so half of what each worker reads is in the other core's cache.
        ``python -m cso calibrate`` times such a plan per call against the
        same plan on filters packed ahead; on a Xeon (Sapphire Rapids, two
        threads) a packed element cost 0.74 ns of thread time that way,
        against 0.30 packed on one thread and 0.30 for a WS plan whose
        workers each read only the panels they packed.  The default is
        ``filter_pack_cost``'s.
    filter_tile_pack_cost : float
        ``filter_pack_cost`` for a plan that packs each filter tile in its
        loop nest just before use (:attr:`Plan.packs_filters_in_nest`): the
        same transposes into a buffer of one tile, which stays in L1/L2,
        so the panels are never written to the L3 and read back.  On a Xeon
        (Sapphire Rapids, one thread) ResNet-50's and ResNeXt-50's 1x1
        layers at 14x14 ran 3.6-7.1% faster per call that way than with
        their panels packed up front.  ``python -m cso calibrate`` times
        the transposes alone, on filters within the L2 (their bytes' trip
        from the L3 or memory is the call's compulsory traffic, charged
        apart): 0.10 ns an element there, about 50 units.  The default is
        that machine's.
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
    in_place_input_cost : float
        Extra cost per input element a micro-kernel reads in place from the
        input (a 1x1, stride-1 layer's channel rows a plane apart, below half
        a page: :func:`~cso.analysis.tiles.reads_input_in_place`) instead of
        from a packed panel (:func:`~cso.analysis.counts.in_place_input_reads`).
        The planner weighs it against packing those panels
        (``input_pack_cost``'s pointwise kind) and takes the cheaper.
        ``python -m cso calibrate`` times a 1x1 layer of 14x14 planes both
        ways, each without its packing
        (:func:`cso.analysis.calibration.in_place_input_cost`).  The default,
        0, reads such layers in place as the analysis always did: on the
        Xeon the defaults come from, reading a 14x14 layer in place was as
        fast as packing it.  On an AMD EPYC (Zen 3), packing was 1.02-1.38x
        faster on ResNet-50's 14x14 and 7x7 layers.
    stream_overlap : float
        Share of the cost of WS's filter stream from L3 or DRAM that hides
        behind the micro-kernels' multiply-adds, up to their cost: the model
        charges ``stream + macs - stream_overlap * min(stream, macs)``
        (:func:`~cso.analysis.pricing.hidden_stream_cost`); 0 sums them, 1
        charges the larger.  ``experiments/cost_weight.py`` times the plans
        a value changes against the plans at 0.  At 0.5 it changed 16 of
        ResNet-50's and VGG-16's plans (batch 1 at one and two threads, per
        call and packed ahead, batch 8): 1.02-1.08x over the changed layers
        of each run, none slower than 0.97x.  At 1 some ran 0.91-0.95x, and
        crediting IS's streams too moved 3x3 layers at two threads to IS,
        0.90-0.95x.
    tap_call_cost : float
        Fixed cost of one call of the depthwise tap kernel (its bias
        broadcast, loop entry and masked stores).
    tap_load_cost : float
        Cost of one input vector the depthwise tap kernel loads, beyond the
        multiply-adds it feeds: the one-row kernel loads a vector per FMA
        and runs at the loads' rate.  Both defaults are
        ``python -m cso calibrate``'s figures on an AMD EPYC (Zen 4,
        AVX-512, 117 GFLOP/s per core;
        :func:`~cso.calibrate.kernel_probes.tap_seconds`): the one-row
        kernel's time on L1-resident rows against its column taps, 0.49 ns
        a call and 0.44 ns a load (a 16-lane FMA is 64 units, 0.27 ns).
    row_call_cost : float
        Fixed cost of one call of the depthwise row kernel inside its loop
        nest (:mod:`cso.analysis.rows`): the nest's per-call and per-plane
        work (the block's window rows, the call's masks, row starts and
        epilogue switch, the job's indices) beside the kernel's FMAs and
        loads.  ``python -m cso calibrate`` times a 3x1 and a 3x3 depthwise
        layer of 7x7 planes (one call a plane) through the row nest and
        takes the intercept of their time a call against the column taps.
        The default is that figure on a Xeon (Sapphire Rapids, 2 cores,
        214-240 GFLOP/s per core); in the tap kernel's own probe loop, whose
        operands are constants, a call cost almost nothing (31 units), and
        priced so the row plans of 7-wide planes ran 1.3-1.6x slower than
        the lane plans the model ranked behind them.  Calibrated with the
        wide planes too, it is a call's own cost, the plane's work apart
        (``row_job_cost``).
    tap_nest_call_cost : float
        Fixed cost of one call of the tap kernel inside the tap nest
        (:func:`cso.analysis.calibration.tap_nest_call_cost`): what prices
        the tap family's calls where measured.  0 by default, where the tap
        kernel's own ``tap_call_cost`` does.
    row_job_cost : float
        Fixed cost of one plane (job) of the row nest beyond its calls,
        told apart from ``row_call_cost`` by timing the nest on planes of
        one call and of 112 (:func:`cso.analysis.calibration.row_job_cost`).
        0 by default, where ``row_call_cost`` holds it.
    plane_call_cost : float
        The same for the plane nest (:mod:`cso.analysis.planes`), measured
        the same way through it; the default its figure on that Xeon.
    unpacked_load_cost : float
        Cost of one vector load of the row kernel (unaligned, whole, masked
        by an and; the plane kernel's too where ``plane_load_cost`` is 0)
        beyond the multiply-adds it feeds, measured
        in the row nest (:func:`cso.analysis.calibration.unpacked_load_cost`)
        at stride 1, and used there.  0 (the default, and records made before
        it was measured), and at stride 2, whose loads come with shuffles:
        the tap kernel's ``tap_load_cost`` less an FMA stands in.
    plane_load_cost : float
        The same for the plane kernel's loads (masked by bit-set masks, a
        mask read beside each), measured in the plane nest
        (:func:`cso.analysis.calibration.plane_load_cost`).  0 (the default,
        and records made before it was measured): ``unpacked_load_cost``
        stands in.
    lane_transpose_cost : float
        Cost of one element the lane nest transposes (the depthwise_lanes
        algorithm's input planes into pixel vectors, its outputs back,
        ``VL x VL`` tiles through registers): ``python -m cso calibrate``
        times a 1x1 depthwise layer through the lane nest, less its one-tap
        kernel.  The default is ``input_pack_cost``'s, the shifted input
        packing it was priced as before it was measured; on a Xeon
        (Sapphire Rapids) a transposed element cost 70-82 units and a
        shifted copy 57-61.
    l1_conflict_cost : float
        Cost of one filter element a window-vectorised kernel reads in place
        from a row whose line its other rows evicted (more rows in one L1
        set than it has ways, :func:`~cso.analysis.counts.conflicting_filter_reads`):
        the line comes again from L2 for that one element.  The default is
        a 64-byte line at ``l1_miss_cost`` (128); on an AMD EPYC (Zen 4) the
        affected ResNet-50 layers ran 1.3-1.5x slower than with 8 rows.
    l3_shared_cost, dram_shared_cost : float
        ``l3_cost`` and ``dram_cost`` when every core streams at once (the
        L3 and the memory bandwidth are shared): what plans for more than
        one thread are priced with.  The defaults are the one-core figures;
        a calibration measures both.
    kernel_mac_costs : tuple of (str, float)
        ``mac_cost`` of each micro-kernel shape a calibration measured, as
        ``(shape, cost)`` pairs (the shape as :func:`~.shape_tables.kernel_shape_key`
        names it, e.g. ``"8x8w"``); a shape without one costs ``mac_cost``.
        Shapes differ: on an AMD EPYC (Zen 3, AVX2) the 8 x 8 kernel, nine
        loads per eight FMAs, ran at 80% of the FMA peak from L1 and the
        6 x 16 at 97%, and with one ``mac_cost`` for both the model chose
        8 x 8 for its lesser padding on 13 of ResNet-50's layers, which it
        ran at 0.65-0.95x the 6 x 16's speed.  Empty by default (one rate
        for every shape, as measured on the AVX-512 Xeon).
    pointwise_mac_costs : tuple of (str, float)
        ``mac_cost`` of each micro-kernel shape on a 1x1 layer, every shape
        a calibration measured there listed (those within the tolerance at
        ``mac_cost``); when it is not empty it stands for
        ``kernel_mac_costs`` on 1x1 layers.  Shapes rank differently there:
        on an AMD EPYC (Zen 3, AVX2) the 8 x 8 kernel ran 7-8% slower than
        the median shape per padded multiply-add on a 3x3 layer and 22-39%
        slower on 1x1 layers, where the model, pricing it by the 3x3
        layer, took it for its lesser padding on ResNet-50's 1x1 layers of
        7x7 outputs and ran them 1.25-1.57x slower than the fastest shape.
        Empty by default.
    kernel_in_place_costs : tuple of (str, float)
        ``in_place_filter_cost`` of each window-vectorised shape a
        calibration measured, as ``(shape, cost)`` pairs; a shape without
        one costs ``in_place_filter_cost``.  The extra time of a filter read
        in place depends on the shape: on an AMD EPYC (Zen 3, AVX2), with the
        filters packed ahead the kernels read each row at a constant offset,
        in place at a multiple of a runtime stride, which cost the 8 x 8
        kernel (one vector per broadcast) 35-50%, the two-vector 4 x 16 and
        6 x 16 ones 0-14% and the three-vector 4 x 24 nothing.
    pointwise_in_place_costs : tuple of (str, float)
        ``in_place_filter_cost`` of each window-vectorised shape on a 1x1
        layer of 1024 channels, every shape a calibration measured there
        listed; when it is not empty it stands for ``kernel_in_place_costs``
        (and the shared weight) on 1x1 layers whose tile's filter rows all
        start in one L1 set as that layer's do (rows ``4*C`` bytes apart, a
        multiple of 4 KiB: 1024 or 2048 channels).  On an AMD EPYC (Zen 3,
        AVX2) a read in place cost the 6 x 16 kernel 26-45 ps on
        ResNet-50's 1x1 layers of 1024 and 2048 channels against 4 ps on
        the 3x3 layer the shared figure comes from, and the model, pricing
        it by the 3x3 layer, kept those layers on 6 x 16, up to 1.47x
        slower than 16 x 6 (filters packed in the call).  Applied to every
        1x1 layer, the figure also moved 512-channel ones (rows 2 KiB
        apart, two sets) off 6 x 16, 2-7% slower.  Empty by default.
    input_pack_costs : tuple of (str, float)
        ``input_pack_cost`` of each kind of input packing a calibration
        measured, as ``(kind, cost)`` pairs (the kinds of
        :func:`~cso.analysis.counts.input_pack_kind`: ``"shifted"``,
        ``"strided"``, ``"pointwise"``, ``"pointwise_strided"``); a kind
        without one costs ``input_pack_cost``.  The kinds differ by what an
        element written costs in reads: on an AMD EPYC (Zen 3) shifted copies
        cost 46-58 units an element, gathers 98 and a 1x1 layer's strided
        pixels 138-144, and one median weight for all three moved from one
        kind's figure to the next between calibrations minutes apart (99
        and 180), so that two calibrations planned only 71% of ResNet-50's
        and VGG-16's layers alike.  Where a kind was also measured on
        narrow rows, the figure is the intercept ``a`` of ``a + b / Q``
        (``input_pack_row_costs``).  Empty by default.
    input_pack_row_costs : tuple of (str, float)
        ``b`` of each kind of input packing measured at two output widths:
        an element of a layer whose output rows are ``Q`` columns wide costs
        ``input_pack_cost_of(kind) + b / Q`` (each row of a panel is copied
        in segments no longer than the output row, and each segment has a
        fixed cost).  On an AMD EPYC (Zen 3) the shifted copies cost 0.21 ns
        an element at 56 columns, 0.41 at 28, 0.67 at 14 and 1.10 at 7, the
        gathers of stride 2 1.0, 1.3 and 2.0 ns at 28, 14 and 7; priced at
        the 56-column figure, a ResNeXt ``3x3 g32 512 @14`` layer's packing
        took 68% of its time, and the model took that dense plan over the
        grouped one, 2x faster there.  Empty by default.
    origin : str
        Where the weights come from: ``"defaults"`` (these figures),
        ``"calibrated"`` (:func:`~cso.analysis.calibration.derive_weights`
        from ``python -m cso calibrate``) or ``"user"`` (changed by hand).
    """

    l2_cost: float = 0.25
    l3_cost: float = 6.0
    dram_cost: float = 20.0
    tlb_miss_cost: float = 1000.0
    call_cost: float = 40000.0
    mac_cost: float = 4.0
    sweep_fraction: float = 2 / 3
    l1_miss_cost: float = 2.0
    transposed_store_cost: float = 128.0
    filter_pack_cost: float = 100.0
    filter_pack_shared_cost: float = 100.0
    filter_pack_call_cost: float = 0.0
    filter_tile_pack_cost: float = 50.0
    input_pack_cost: float = 80.0
    in_place_filter_cost: float = 6.0
    in_place_input_cost: float = 0.0
    stream_overlap: float = 0.5
    tap_call_cost: float = 110.0
    tap_load_cost: float = 100.0
    lane_transpose_cost: float = 80.0
    row_call_cost: float = 9600.0
    row_job_cost: float = 0.0
    tap_nest_call_cost: float = 0.0
    plane_call_cost: float = 5700.0
    unpacked_load_cost: float = 0.0
    plane_load_cost: float = 0.0
    l3_shared_cost: float = 6.0
    dram_shared_cost: float = 20.0
    l1_conflict_cost: float = 128.0
    kernel_mac_costs: tuple = ()
    pointwise_mac_costs: tuple = ()
    kernel_in_place_costs: tuple = ()
    pointwise_in_place_costs: tuple = ()
    input_pack_costs: tuple = ()
    input_pack_row_costs: tuple = ()
    origin: str = "defaults"

    def __post_init__(self):
        if not isinstance(self.origin, str):
            raise TypeError(f"CostWeights.origin must be a str, got {self.origin!r}")
        for table in SHAPE_TABLES:
            object.__setattr__(
                self, table, shape_pairs(getattr(self, table), f"CostWeights.{table}")
            )
        for field in fields(self):
            if field.name in ("origin",) + SHAPE_TABLES:
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"CostWeights.{field.name} must be a number, got {value!r}")
            if field.name in _FRACTIONS:
                continue
            if not value >= 0.0 or value == float("inf"):
                raise ValueError(
                    f"CostWeights.{field.name} must be finite and non-negative, got {value!r}"
                )
        if not 0.0 < self.sweep_fraction <= 1.0:
            raise ValueError(
                f"CostWeights.sweep_fraction must be in (0, 1], got {self.sweep_fraction!r}"
            )
        if not 0.0 <= self.stream_overlap <= 1.0:
            raise ValueError(
                f"CostWeights.stream_overlap must be in [0, 1], got {self.stream_overlap!r}"
            )


    def mac_cost_of(self, shape: str, pointwise: bool = False) -> float:
        """``c_mac`` of the micro-kernel ``shape`` (:func:`~.shape_tables.kernel_shape_key`):
        its own from ``kernel_mac_costs`` (from ``pointwise_mac_costs`` on a
        1x1 layer, ``pointwise``, when that table is not empty), else
        ``mac_cost``."""
        return dict(self.mac_cost_table(pointwise)).get(shape, self.mac_cost)

    def mac_cost_table(self, pointwise: bool = False) -> tuple:
        """The per-shape mac costs in force: ``pointwise_mac_costs`` on a 1x1
        layer (``pointwise``) when that table is not empty, else
        ``kernel_mac_costs``."""
        if pointwise and self.pointwise_mac_costs:
            return self.pointwise_mac_costs
        return self.kernel_mac_costs

    def in_place_cost_of(self, shape: str, pointwise: bool = False) -> float:
        """``c_in_place`` of the micro-kernel ``shape``: its own from
        :meth:`in_place_cost_table`, else ``in_place_filter_cost``."""
        return dict(self.in_place_cost_table(pointwise)).get(shape, self.in_place_filter_cost)

    def in_place_cost_table(self, pointwise: bool = False) -> tuple:
        """The per-shape in-place costs in force: ``pointwise_in_place_costs``
        on a 1x1 layer whose filter rows share one L1 set (``pointwise``)
        when that table is not empty, else ``kernel_in_place_costs``."""
        if pointwise and self.pointwise_in_place_costs:
            return self.pointwise_in_place_costs
        return self.kernel_in_place_costs

    def input_pack_cost_of(self, kind, out_width: int = None) -> float:
        """``c_input`` of the input packing ``kind``
        (:func:`~cso.analysis.counts.input_pack_kind`): its own from
        ``input_pack_costs``, else ``input_pack_cost`` (also for ``None``),
        plus ``b / out_width`` where ``input_pack_row_costs`` has the kind's
        ``b`` and the layer's output width is given."""
        cost = dict(self.input_pack_costs).get(kind, self.input_pack_cost)
        row = dict(self.input_pack_row_costs).get(kind)
        if row is not None and out_width:
            cost += row / out_width
        return cost


# The per-shape (and per-kind) tables, each (name, weight) pairs overriding
# the weight it maps to here.
TABLE_WEIGHTS = {
    "kernel_mac_costs": "mac_cost",
    "pointwise_mac_costs": "mac_cost",
    "kernel_in_place_costs": "in_place_filter_cost",
    "pointwise_in_place_costs": "in_place_filter_cost",
    "input_pack_costs": "input_pack_cost",
    "input_pack_row_costs": "input_pack_cost",
}
SHAPE_TABLES = tuple(TABLE_WEIGHTS)
# How each table's rows are labelled in reports: its weight's name, and
# another where two tables share a weight (the costs on 1x1 layers, and the
# input packing's per-row term).
TABLE_LABELS = dict(
    TABLE_WEIGHTS,
    pointwise_mac_costs="mac_cost 1x1",
    pointwise_in_place_costs="in_place_filter_cost 1x1",
    input_pack_row_costs="input_pack_cost b/Q",
)

# Weights that are shares, checked against their own ranges.
_FRACTIONS = ("sweep_fraction", "stream_overlap")

DEFAULT_WEIGHTS = CostWeights()
