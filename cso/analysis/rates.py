"""What the calibration measures on one machine: :class:`MeasuredRates`.

The rates are times and bandwidths in SI units, the record
``python -m cso calibrate`` keeps (:mod:`.calibration_store`) and
:mod:`.calibration` derives the cost weights from.  This module only
holds and checks them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .shape_tables import shape_pairs


def width_name(kind: str, columns: int) -> str:
    """``"<kind>@<columns>"``: how ``input_pack_width_seconds`` names a kind
    of input packing measured on a layer of ``columns`` output columns."""
    return f"{kind}@{columns}"


def split_width_name(name: str) -> tuple:
    """``(kind, columns)`` of a :func:`width_name`; ValueError for any other string."""
    kind, at, columns = name.partition("@")
    if not (kind and at and columns.isascii() and columns.isdigit() and int(columns) > 0):
        raise ValueError(
            f"MeasuredRates.input_pack_width_seconds: names are '<kind>@<columns>', got {name!r}"
        )
    return kind, int(columns)


@dataclass(frozen=True)
class MeasuredRates:
    """What the calibration measured on one machine, in SI units, one core
    unless the name says ``shared`` (every core at once, per core).

    Parameters
    ----------
    fma_flops : float
        float32 FMA peak of one core, FLOP/s (register-only FMA chains).
    kernel_flops : float
        The micro-kernels' float32 rate with every operand in L1, FLOP/s
        (the median over the shapes the planner offers; in a full
        calibration, the median of three such passes spread over it).
    l2_stream_seconds_per_byte : float
        Extra time per byte of a micro-kernel's streamed operand read from
        L2 instead of L1 (the same kernel, its streamed panels cycling
        through more tiles than L1 holds; the least over the shapes: what
        each shape adds beyond it is in its ``loop_shape_seconds``).
    l3_bytes_per_second, dram_bytes_per_second : float
        Streaming read bandwidth of one core from a buffer resident in L3,
        and from one several times larger than L3.
    l3_shared_bytes_per_second, dram_shared_bytes_per_second : float
        The same, per core, with every core reading its own buffer at once.
    l1_spill_seconds_per_byte : float
        Extra time per byte of a kernel's stationary operand when it does
        not fit in L1 beside the streamed one and both come from L2 (a
        window-vectorised kernel of a reduction too deep for L1, cycling
        over panels in L2, against its L1 rate), per byte of its filters.
    l2_line_reload_seconds : float
        Time to reload one cache line from L2 that the prefetchers did not
        bring in: a kernel reading filter rows whose lines overflow one L1
        set, against the same rows spread over the sets, per filter read.
    tlb_miss_seconds : float
        Extra time of a load that misses the first-level data TLB (a chase
        over more pages than it has entries, against one over few pages).
    kernel_call_seconds : float
        Marginal time of one micro-kernel call inside the loop nest: the
        slope of a layer's time against its call count as its channel tile
        shrinks (the multiply-adds unchanged).
    transposed_store_seconds : float
        Extra write-back time per output element of a filter-vectorised
        kernel over a window-vectorised one of the same tile.
    input_pack_seconds : float
        Time per input element written into panels (a layer's loop nest
        with its micro-kernel a no-op, less the same nest that does not pack
        either, per packed element; the median over the kinds of packing,
        each also kept in ``input_pack_kind_seconds``).
    filter_pack_seconds : float
        Time per filter element packed for a filter-vectorised kernel.
    in_place_filter_seconds : float
        Extra time per filter element a window-vectorised kernel reads in
        place from KCRS rather than from a packed panel (may be 0).
    tap_call_seconds : float
        Fixed time of one depthwise tap-kernel call: the intercept of the
        one-row kernel's time on L1-resident rows against its column taps.
    tap_load_seconds : float
        Time per input vector the one-row tap kernel loads (one per FMA):
        that fit's slope over its vectors.
    lane_transpose_seconds : float
        Time per element the lane nest transposes (its input planes into
        pixel vectors and its outputs back): a 1x1 depthwise layer through
        the lane nest, less its one-tap kernel (a ninth of what a 3x3 one
        adds), over the elements transposed.  0 in records made before it
        was measured (the shifted input packing's rate stands in).
    row_call_seconds : float
        Fixed time of one row-kernel call in its loop nest: a 3x1 and a 3x3
        depthwise layer of 7x7 planes (one call a plane) through the row
        nest, ``(3 t_1 - t_3) / 2`` of their times a call (the intercept
        against the column taps).  0 in records made before it was measured
        (the tap kernel's call time stands in).
    plane_call_seconds : float
        The same for the plane nest (3x1 filters padded to keep ``Q == W``).
    plane_column_seconds, plane_column_macs, plane_column_loads : float
        What one more column of taps adds to a plane-kernel call in its
        loop nest, from the same two layers, as ``row_column_seconds`` and
        its counts for the row nest.  0 in records made before they were
        measured (the row kernel's load rate then stands in).
    row_wide_call_seconds : float
        ``row_call_seconds``' intercept on a layer of 112x112 planes.  0 in
        records made before it was measured (``row_call_seconds`` then
        prices a call whatever its plane).
    row_calls_per_plane, row_wide_calls_per_plane : float
        The row-kernel calls a plane of each of the two layers takes by
        their plans (one, and 112).
    tap_nest_call_seconds : float
        The tap nest's call intercept, as ``row_wide_call_seconds`` (a 3x1
        and a 3x3 depthwise layer of 112x112 planes, 266 calls a plane,
        through the tap nest).  0 in records made before it was measured
        (the tap kernel's own ``tap_call_seconds`` then prices its calls).
    row_column_seconds, row_column_macs, row_column_loads : float
        What one more column of taps adds to a row-kernel call in its loop
        nest, from the same two layers: ``(t_3 - t_1) / 2`` a call, and the
        multiply-adds and vector loads (masks and weight broadcasts
        included) it adds by the plans' own counts.  0 in records made
        before they were measured (the tap kernel's load rate stands in).
    filter_tile_pack_seconds : float
        Time per filter element packed tile by tile into one tile's buffer
        (what a loop nest that packs its filters just before use does,
        :func:`~cso.analysis.tiles.packs_filters_in_nest`): a layer's KCRS
        filters beyond the L2, every (channel tile, filter tile) of a
        filter-vectorised plan packed in turn.  0 in records made before it
        was measured (``filter_pack_seconds`` stands in).
    filter_pack_call_seconds : float
        A small 1x1 layer (65,536 filter elements) through a one-thread
        filter-vectorised plan that packs its panels up front, per call less
        the same plan on filters packed ahead (interleaved rounds): the
        packing as a call meets it, with the caches as the layer's own
        traffic leaves them.  0 in records made before it was measured.
    filter_pack_call_elements : float
        The filter elements that plan packs (``filter_pack_call_seconds``'
        count).
    filter_pack_shared_seconds : float
        Thread time per filter element packed in a call whose workers each
        read every packed panel (a plan on all cores whose window tiles are
        split among them): the per-call plan less the same plan on filters
        packed ahead, times the threads, over the elements packed.  The
        panels are packed in a parallel pass, so each worker reads half of
        them from the other core's cache.  0 in records made before it was
        measured, or on one core (``filter_pack_seconds`` stands in).
    in_place_input_seconds : float
        Extra time per input element a micro-kernel reads in place (a 1x1
        layer's channel rows, 14x14 planes) rather than from a packed panel:
        the same plan both ways on filters packed ahead, each without its
        packing, over the reads in place; the median over the shapes the
        planner offers.  0 in records made before it was measured (the
        input is then read in place wherever it may be, as before).
    prefetch_speedup : float
        How much faster the dense loop nests run with the micro-kernels'
        software prefetch than without (``t_without / t_with``, the median
        over three layers' paired rounds); 0 in records made before it
        was measured (the prefetch then stays).
    kernel_shape_flops : tuple of (str, float)
        Each micro-kernel shape's float32 rate with every operand in L1,
        FLOP/s (the best of the calibration's passes: other tenants only
        ever slow a kernel), as ``(shape, rate)`` pairs (shapes named by
        :func:`~cso.analysis.shape_tables.kernel_shape_key`; a mapping is
        accepted).  Empty in records made before it was measured.
    in_place_shape_seconds : tuple of (str, float)
        ``in_place_filter_seconds`` measured with each window-vectorised
        shape, as ``(shape, seconds)`` pairs (the scalar is their median).
    input_pack_kind_seconds : tuple of (str, float)
        ``input_pack_seconds`` measured for each kind of input packing
        (:func:`~cso.analysis.counts.input_pack_kind`), as ``(kind,
        seconds)`` pairs (the scalar is their median).  Empty in records made
        before it was measured.
    loop_shape_seconds : tuple of (str, float)
        Each micro-kernel shape's time per padded multiply-add inside the
        loop nest: one layer planned with the shape forced and its filters
        packed ahead, timed whole, over the plan's padded multiply-adds (the
        quickest of the calibration's passes), as ``(shape, seconds)``
        pairs.  Where it was measured it sets the
        shapes' own mac costs (:func:`kernel_mac_costs`) instead of the
        rates from L1.  Empty in records made before it was measured.
    input_pack_width_seconds : tuple of (str, float)
        ``input_pack_seconds`` of some kinds measured at two output widths,
        as ``("<kind>@<columns>", seconds)`` pairs (e.g. ``"shifted@56"``,
        ``"shifted@7"``): what sets each kind's per-row term
        (:func:`input_pack_row_costs`).  Empty in records made before it
        was measured.
    loop_pointwise_shape_seconds : tuple of (str, float)
        The same on a 1x1 layer (its window tiles' channels streaming from
        L2): where it was measured it sets the shapes' mac costs on 1x1
        layers (:func:`pointwise_mac_costs`).  Empty in records made before
        it was measured.
    in_place_pointwise_shape_seconds : tuple of (str, float)
        ``in_place_shape_seconds`` on a 1x1 layer of 1024 channels, whose
        filter rows lie 4 KiB apart: where it was measured it sets the
        shapes' in-place costs on 1x1 layers
        (:func:`pointwise_in_place_costs`).  Empty in records made before
        it was measured.
    """

    fma_flops: float
    kernel_flops: float
    l2_stream_seconds_per_byte: float
    l3_bytes_per_second: float
    dram_bytes_per_second: float
    l3_shared_bytes_per_second: float
    dram_shared_bytes_per_second: float
    l1_spill_seconds_per_byte: float
    l2_line_reload_seconds: float
    tlb_miss_seconds: float
    kernel_call_seconds: float
    transposed_store_seconds: float
    input_pack_seconds: float
    filter_pack_seconds: float
    in_place_filter_seconds: float
    tap_call_seconds: float
    tap_load_seconds: float
    lane_transpose_seconds: float = 0.0
    row_call_seconds: float = 0.0
    plane_call_seconds: float = 0.0
    plane_column_seconds: float = 0.0
    plane_column_macs: float = 0.0
    plane_column_loads: float = 0.0
    row_column_seconds: float = 0.0
    row_column_macs: float = 0.0
    row_column_loads: float = 0.0
    row_wide_call_seconds: float = 0.0
    row_calls_per_plane: float = 0.0
    row_wide_calls_per_plane: float = 0.0
    tap_nest_call_seconds: float = 0.0
    filter_pack_shared_seconds: float = 0.0
    filter_pack_call_seconds: float = 0.0
    filter_pack_call_elements: float = 0.0
    filter_tile_pack_seconds: float = 0.0
    in_place_input_seconds: float = 0.0
    prefetch_speedup: float = 0.0
    kernel_shape_flops: tuple = ()
    in_place_shape_seconds: tuple = ()
    input_pack_kind_seconds: tuple = ()
    loop_shape_seconds: tuple = ()
    loop_pointwise_shape_seconds: tuple = ()
    in_place_pointwise_shape_seconds: tuple = ()
    input_pack_width_seconds: tuple = ()

    def __post_init__(self):
        for name in _SHAPE_RATES:
            object.__setattr__(
                self,
                name,
                shape_pairs(
                    getattr(self, name),
                    f"MeasuredRates.{name}",
                    zero_allowed=name not in _POSITIVE_SHAPE_RATES,
                ),
            )
        for name, _ in self.input_pack_width_seconds:
            split_width_name(name)
        for field in fields(self):
            if field.name in _SHAPE_RATES:
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"MeasuredRates.{field.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"MeasuredRates.{field.name} must be finite and non-negative, got {value!r}"
                )
            if field.name.endswith(("flops", "per_second")) and value == 0:
                raise ValueError(f"MeasuredRates.{field.name} must be positive, got 0")

    def to_dict(self) -> dict:
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        for name in _SHAPE_RATES:
            values[name] = dict(values[name])
        return values

    @staticmethod
    def from_dict(values: dict) -> "MeasuredRates":
        """Raises TypeError or ValueError when ``values`` is malformed."""
        if not isinstance(values, dict):
            raise TypeError(f"measured rates must be a mapping, got {type(values).__name__}")
        return MeasuredRates(**values)


# The per-shape tables of MeasuredRates.
_SHAPE_RATES = (
    "kernel_shape_flops",
    "in_place_shape_seconds",
    "input_pack_kind_seconds",
    "loop_shape_seconds",
    "loop_pointwise_shape_seconds",
    "input_pack_width_seconds",
    "in_place_pointwise_shape_seconds",
)
# Of those, the tables whose figures are rates or whole times, never 0.
_POSITIVE_SHAPE_RATES = ("kernel_shape_flops", "loop_shape_seconds", "loop_pointwise_shape_seconds")
