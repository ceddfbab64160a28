"""What each loop nest moves and does: the counts the cost model weighs.

One small function per count, each with its formula, read straight off the
loop nests of :mod:`cso.macrokernel.loops` (the notation and the nests are
in :mod:`.cost`'s docstring); :mod:`.cost` weighs them into one figure.
"""

from __future__ import annotations

from ..geometry import ceil_div
from .choices import Schedule, VectorOperand


def level_of(size: int, l2_usable: int, l3_usable: int) -> str:
    """The level a working set of ``size`` bytes is served from between reuses."""
    if size <= l2_usable:
        return "l2"
    if size <= l3_usable:
        return "l3"
    return "dram"


def compulsory_bytes(raw_input: int, all_filters: int, all_outputs: int) -> int:
    """``RAW + T_f*FS_all + K*P*Q*s``: every operand read or written once from
    DRAM (the filters' share of one window space, when a batch shares them)."""
    return raw_input + all_filters + all_outputs


def partial_sum_bytes(
    channel_tiles: int, window_tiles: int, filter_tiles: int, out_tile: int
) -> int:
    """``(2*T_c - 1) * T_w * T_f * OUT``: output tiles written once per channel
    tile and read back for every channel tile after the first."""
    return (2 * channel_tiles - 1) * window_tiles * filter_tiles * out_tile


def is_filter_stream_bytes(window_blocks: int, filter_tiles: int, filter_all: int) -> int:
    """IS: ``B_w * T_f * FS_all``: every window block streams all filters into L2."""
    return window_blocks * filter_tiles * filter_all


def is_input_reload_bytes(filter_blocks: int, window_tiles: int, input_all: int) -> int:
    """IS: ``B_f * T_w * IN_all``: each input tile re-enters L1 once per filter block."""
    return filter_blocks * window_tiles * input_all


def ws_raw_input_bytes(filter_blocks: int, raw_input: int) -> int:
    """WS: ``B_f * RAW``: the input is read (and packed) once per filter block."""
    return filter_blocks * raw_input


def ws_filter_reload_bytes(window_blocks: int, filter_tiles: int, filter_all: int) -> int:
    """WS: ``B_w * T_f * FS_all``: each filter tile re-enters L1 once per window block."""
    return window_blocks * filter_tiles * filter_all


def ws_filter_stream_bytes(
    passes: int, filter_tiles: int, filter_all: int, first_pass: int, packed_in_nest: bool
) -> int:
    """WS: what the kernels stream of the filters from L3 or DRAM as they
    compute: ``0`` where each filter tile is packed in the loop nest just
    before its use (the tile stays in L1/L2 for its calls, and the packing
    makes the one read from memory, the compulsory one); else ``max(0,
    passes*T_f*FS_all - first)``, :func:`ws_filter_reload_bytes` for
    ``passes`` window blocks (those of one part where the workers of a call's
    window parts read the filters together) less ``first``: the compulsory
    read, where the kernels make it (no packing pass reads the filters
    before them), else 0.

    Charged as both the compulsory read and a pass of the stream, a 3x3
    512-channel layer's 9.4 MB of filters made two threads on a Xeon split
    its filters (32x14f, packing) where splitting its windows (14x32w, each
    worker reading every filter in place) ran 1.08-1.11x faster."""
    if packed_in_nest:
        return 0
    return max(0, ws_filter_reload_bytes(passes, filter_tiles, filter_all) - first_pass)


def kernel_operand_bytes(window_tiles: int, filter_tiles: int, tile_all: int) -> int:
    """``T_w * T_f * tile_all``: the streamed operand read by every kernel call
    (filters from L2 in IS, input tiles from L2 in WS)."""
    return window_tiles * filter_tiles * tile_all


def packed_write_bytes(times_packed: int, window_tiles: int, input_all: int) -> int:
    """``times * T_w * IN_all``: packed input panels written."""
    return times_packed * window_tiles * input_all


def output_pages_per_tile(filters_per_tile: int, row_bytes: int, page_bytes: int) -> int:
    """Pages one output tile's ``Nf`` rows lie on: ``Nf`` when a row
    (``P*Q*s`` bytes) fills a page, else ``ceil(Nf * row / page)``."""
    if row_bytes >= page_bytes:
        return filters_per_tile
    return ceil_div(filters_per_tile * row_bytes, page_bytes)


def output_tlb_misses(
    schedule: str,
    channel_tiles: int,
    window_tiles: int,
    filter_tiles: int,
    k2: int,
    pages_per_tile: int,
    output_pages: int,
    tlb_entries: int,
) -> int:
    """Data-TLB misses of the output writes.

    IS: ``T_c*T_w*T_f*pages`` when the ``K2`` tiles cycled by the innermost
    loop span more pages than the TLB holds (``K2*pages > entries``), else
    the output's pages once per channel tile.
    WS: the innermost loop stays on one tile's rows, so ``T_c * output_pages``
    (each page entered once per channel tile) unless one tile's rows alone
    outnumber the TLB.
    """
    cycled = k2 * pages_per_tile if schedule == Schedule.IS else pages_per_tile
    if cycled > tlb_entries:
        return channel_tiles * window_tiles * filter_tiles * pages_per_tile
    return channel_tiles * output_pages


def kernel_calls(channel_tiles: int, window_tiles: int, filter_tiles: int) -> int:
    """``T_c * T_w * T_f``: one micro-kernel call per output tile and channel tile."""
    return channel_tiles * window_tiles * filter_tiles


def l1_spill_bytes(
    stationary_tile: int,
    streamed_tile: int,
    out_tile: int,
    l1_usable: int,
    calls: int,
    reuse: int,
) -> int:
    """``calls * stationary * (1 - 1/reuse)`` when ``IN + FS + OUT > L1``, else 0.

    The innermost loop reuses one tile (IN in IS, FS in WS) across ``reuse``
    consecutive calls while the other streams through L1.  When the two
    and the output tile overflow L1 (the L1 rule broken), the stream evicts
    the stationary tile, every one of those calls reads it again from L2
    instead of only the first, and both operands come from L2 at once.
    """
    if stationary_tile + streamed_tile + out_tile <= l1_usable:
        return 0
    return calls * stationary_tile * (reuse - 1) // reuse


def padded_macs(window_tiles, windows_per_tile, filter_tiles, filters_per_tile, reduction) -> int:
    """``T_w*Nwin * T_f*Nf * C*R*S``: the multiply-adds the micro-kernels do,
    edge tiles' padding included (what a micro-kernel shape costs in compute)."""
    return window_tiles * windows_per_tile * filter_tiles * filters_per_tile * reduction


def transposed_stores(vector_operand: str, calls: int, out_tile_elements: int) -> int:
    """``calls * Nf * Nwin`` for a filter-vectorised micro-kernel (it stores
    its tile element by element), 0 for the window-vectorised one (vector stores,
    in ``c_call``)."""
    return calls * out_tile_elements if vector_operand == VectorOperand.FILTERS else 0


def packed_filter_elements(
    vector_operand: str,
    filters_prepacked: bool,
    filter_tiles: int,
    filter_all: int,
    element_bytes: int,
    batch: int,
) -> int:
    """``T_f*FS_all/s / N``: the filter elements a filter-vectorised plan packs
    in each call, per image (one packing serves the batch); 0 when the filters
    were packed ahead or the kernel reads them in place (windows orientation)."""
    if vector_operand != VectorOperand.FILTERS or filters_prepacked:
        return 0
    return ceil_div(filter_tiles * filter_all // element_bytes, max(1, batch))


def l3_resident_bytes(l2_bytes: int, l3_bytes: int, cores: int) -> int:
    """``min(4 * L2, max(2 * L2, L3 / (2 * cores)))``: the footprint per
    core that the calibration reads as L3-resident (its L3 probe), and
    beyond which the model does not take a buffer kept between calls to
    stay in the L3.

    Beyond the core's L2 (at least twice it), and no more than the few L2s
    an operand the model calls L3-resident spans.  Half the L3's share per
    core, the probe's footprint before, read from memory where the L3 a
    machine reports is not the one its cores have: a KVM guest on a
    Sapphire Rapids host reports 480 MiB, and a 120 MiB buffer read at 20
    GB/s against 30 for 3-48 MiB (19 GB/s from DRAM), so the model priced
    L3 as memory.
    """
    return min(4 * l2_bytes, max(2 * l2_bytes, l3_bytes // (2 * cores)))


def packed_filter_memory_bytes(
    packed_elements: int, element_bytes: int, resident_bytes: int, sharers: int = 1
) -> int:
    """``2*E*s`` when a worker's share of the ``E`` filter elements a call
    packs (``s`` bytes each; ``E*s/sharers``, ``sharers`` the workers that
    split the filter blocks, 1 where every worker reads every panel)
    exceeds ``resident_bytes`` (:func:`l3_resident_bytes`), else 0: the
    bytes between the panels and memory.

    Larger than that, the kept buffer a call packs into is no longer in
    the caches when the next call packs into it again, so each line is
    read from memory before it is written (write-allocate) and written
    back later.  The filter-packing probe packs one layer back to back, the
    buffer in the L3 throughout, and does not see this.  Measured on a Xeon
    (2 MiB L2, so 8 MiB resident): VGG-16's ``3x3 512 @14`` (9.4 MB of
    filters) at one thread, the 32x14 kernel packing its filters in the
    call ran 1.07-1.15x slower than the 14x32 kernel reading them in place,
    timed interleaved with other plans (1.13x with its operands cycled
    through memory), where the model without this count had it 2.4%
    faster; at two threads, each worker packing and reading its half, it
    was as fast.  ResNet-50's 2-4 MB filter sets lose nothing so (their
    buffer stays in the L3): charging every set beyond the L2 made the
    32x14 kernel lose layers where it ran 4-10% faster.
    """
    panel_bytes = packed_elements * element_bytes
    return 2 * panel_bytes if panel_bytes > resident_bytes * max(1, sharers) else 0


# The kinds of input packing, each with its own cost per element written.
INPUT_PACK_KINDS = ("shifted", "strided", "pointwise", "pointwise_strided")


def input_pack_kind(kernel_height: int, kernel_width: int, stride_w: int) -> str:
    """How a layer's input panels are written (:mod:`cso.packing.inputs`),
    which sets what an element written costs in reads:

    * ``"shifted"``: ``R*S > 1``, ``stride_w = 1``: the ``S`` rows of a
      kernel row are one input segment shifted, read once and copied from
      registers (each input element is written about ``R*S`` times);
    * ``"strided"``: ``R*S > 1``, ``stride_w > 1``: every row a gather (or
      a deinterleaved pair of loads at stride 2);
    * ``"pointwise"``: 1x1, ``stride_w = 1``: each channel's pixels copied
      once, in runs (every element read from memory once);
    * ``"pointwise_strided"``: 1x1, ``stride_w > 1``: each pixel gathered
      once, so that every element written is a fresh read.
    """
    if kernel_height * kernel_width > 1:
        return "shifted" if stride_w == 1 else "strided"
    return "pointwise" if stride_w == 1 else "pointwise_strided"


def packed_input_elements(
    schedule: str,
    input_in_place: bool,
    filter_blocks: int,
    window_tiles: int,
    input_all: int,
    element_bytes: int,
    windows_per_tile: int = 1,
    vector_lanes: int = 1,
) -> int:
    """Input elements written into panels, each panel row of ``Nwin`` rounded
    up to whole vectors: ``T_w*IN_all/s * ceil(Nwin/VL)*VL/Nwin`` once in IS,
    once per filter block (``B_f`` times) in WS; 0 when the kernel reads the
    input in place (its few edge tiles aside).

    Packing writes each panel row as whole vectors, the last one masked
    (:mod:`cso.packing.vector_copy`), so a row of 7 windows costs a 16-lane
    write as one of 16 does: on a Xeon, packing the input of ``1x1 384->48
    @28`` for a 48 x 7 kernel took 80 us against 49 for 8 x 48 (the same
    elements, rows of 48).
    """
    if input_in_place:
        return 0
    times = 1 if schedule == Schedule.IS else filter_blocks
    elements = times * window_tiles * input_all // element_bytes
    nwin, lanes = max(1, windows_per_tile), max(1, vector_lanes)
    return elements * (-(-nwin // lanes) * lanes) // nwin


def in_place_input_reads(
    input_in_place: bool, vector_operand: str, filter_tiles: int, full_window_tiles: int,
    windows_per_tile: int, reduction: int,
) -> int:
    """Input elements the micro-kernels read in place from ``x``:
    ``T_f * T_w,full * Nwin * C*R*S`` (every call on a full window tile
    reads its ``Nc x Nwin`` panel from the channel rows, and the channel
    tiles add up to ``C``) when the plan reads its input in place, else 0.
    Edge tiles are packed either way, and a dot-product kernel (its one
    window the whole input) has no panel to pack instead: neither counts.
    """
    if not input_in_place or vector_operand == VectorOperand.REDUCTION:
        return 0
    return filter_tiles * full_window_tiles * windows_per_tile * reduction


def in_place_filter_reads(
    vector_operand: str, filters_prepacked: bool, macs: int, windows_per_tile: int
) -> int:
    """Filter elements the micro-kernels read in place from KCRS:
    ``MACs / Nwin`` (one broadcast per ``Nwin`` multiply-adds) for a
    window-vectorised kernel called with unpacked filters, else 0 (its
    packed edge tiles are counted too: a few per call)."""
    if vector_operand != VectorOperand.WINDOWS or filters_prepacked:
        return 0
    return macs // windows_per_tile


def rows_share_one_l1_set(kernel_area: int, rows: int, busiest_set: int) -> bool:
    """``R*S = 1`` and ``busiest_set = Nf > 1``: a 1x1 layer whose tile's
    ``Nf`` filter rows all start in one L1 set (rows a multiple of 4 KiB
    apart), as the calibration's 1x1 in-place probe layer's do; its reads in
    place are priced by ``CostWeights.pointwise_in_place_costs``."""
    return kernel_area == 1 and busiest_set == rows > 1


def rows_per_l1_set(rows: int, row_stride_bytes: int, line_bytes: int, l1_sets: int) -> int:
    """``max_set |{i < rows : (i*stride // line) mod sets = set}|``: how many of
    ``rows`` rows, ``row_stride_bytes`` apart, start in the busiest L1 set.

    A window-vectorised kernel reading filters in place broadcasts from
    ``Nf`` KCRS rows ``C*R*S*s`` bytes apart at every step.  With a stride
    that is a multiple of ``line * sets`` (4 KiB on most x86 cores: 1x1
    layers of 1024 or 2048 channels) every row maps to one set.
    """
    sets = max(1, l1_sets)
    counts = {}
    for row in range(rows):
        index = (row * row_stride_bytes // max(1, line_bytes)) % sets
        counts[index] = counts.get(index, 0) + 1
    return max(counts.values(), default=0)


def conflicting_filter_reads(
    in_place_reads: int, rows_per_set: int, l1_ways: int, probe_rows: int = None
) -> int:
    """The in-place filter reads charged ``c_conflict`` each: ``reads *
    overflow(rows) / overflow(probe_rows)``, ``overflow(n) = (n - ways) / n``,
    0 when the rows that share an L1 set fit in its ways.

    Past the ways the rows' lines evict each other before their 16
    broadcasts are used, and a share of the broadcasts load their line again
    from L2, a larger share the more the rows overflow the set.
    ``c_conflict`` is measured with ``probe_rows`` rows in one set
    (:func:`~cso.analysis.tiles.conflict_probe_shape`; all reads when None).
    Measured on an AMD EPYC (Zen 4, 8-way L1d): ResNet-50's ``1x1
    1024->256 @14`` ran 65 GFLOP/s with 14 filter rows read in place against
    92 with 8 rows and 98 with packed filters (``experiments/forced_shapes.py``).
    On a Xeon (12-way L1d), 16 rows one way apart ran 16-18% slower than
    spread out and 14 rows 1-11% (three runs each); in a ``1x1 1024->224
    @7`` layer 14 rows cost 2.8% against 1008 channels (no shared set),
    where counting every read charged 8% (and took 8x32w, 7% slower).
    """
    if rows_per_set <= l1_ways:
        return 0
    if probe_rows is None or probe_rows <= l1_ways:
        return in_place_reads
    share = (rows_per_set - l1_ways) / rows_per_set
    probe_share = (probe_rows - l1_ways) / probe_rows
    return round(in_place_reads * share / probe_share)


def thread_imbalance(
    threads: int,
    outer_jobs: int,
    stationary_blocks: int,
    window_parts: int,
    largest_job_share: float,
) -> float:
    """How much longer the busiest thread works than an even share: ``T * critical / total``.

    The parallel loop runs ``J = outer_jobs * stationary_blocks * window_parts``
    jobs on ``T`` threads.  A thread does at least the largest job
    (``largest_job_share`` of one (group, image)'s work) and at least
    ``ceil(J/T)`` average jobs::

        critical = max(largest / outer_jobs, ceil(J/T) / J)       (of the total)
        imbalance = T * min(1, critical)

    1 at one thread.  Seven window tiles split 4 + 3 over two threads give
    ``2 * 4/7 = 1.14``: the 14x14 layers lose a seventh of the second core
    unless the filters are split instead.
    """
    jobs = max(1, outer_jobs * stationary_blocks * window_parts)
    critical = max(largest_job_share / max(1, outer_jobs), ceil_div(jobs, threads) / jobs)
    return threads * min(1.0, critical)


def largest_job_share(
    schedule: str, window_tiles: int, filter_tiles: int, k3: int, window_parts: int
) -> float:
    """The largest job's share of one (group, image): ``min(K3, T_f)/T_f *
    ceil(T_w/parts)/T_w`` in WS (a filter block by a window part),
    ``min(K3, T_w)/T_w`` in IS (a window block)."""
    if schedule == Schedule.IS:
        return min(k3, window_tiles) / window_tiles
    return (
        min(k3, filter_tiles) / filter_tiles * ceil_div(window_tiles, window_parts) / window_tiles
    )
