"""The plan: every decision the analysis makes for one convolution, frozen.

``plan_conv2d`` is a pure function of the problem and a :class:`Hardware`:
it picks the micro-kernel shape from the register file, the channel tile
from L1, the L2/L3 tile counts for both schedules from the CSA rules, and
the schedule with the lower modelled cost.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from ..geometry import ConvGeometry, SUPPORTED_DTYPES, ceil_div, make_geometry
from . import cost, tiles
from .cost import Traffic
from .hardware import Hardware

VECTOR_OPERANDS = ("windows", "filters", "reduction")

SCHEDULES = ("IS", "WS")


@dataclass(frozen=True)
class Plan:
    """How cso computes one convolution.

    Attributes
    ----------
    schedule : {"IS", "WS"}
        Input-stationary or weight-stationary loop nest.
    channel_tile : int
        ``Nc``, channels per packed tile: among ``ceil(C / T_c)`` for ``T_c``
        from the L1 rule's value halving down to one tile, the cheapest.
    l2_tiles : int
        ``K2``, streamed tiles kept in L2 (filter tiles for IS, window tiles for WS).
    l3_tiles : int
        ``K3``, stationary tiles kept in L3 (window tiles for IS, filter tiles
        for WS); also the unit of work of one thread.
    filters_per_tile : int
        ``Nf``, micro-kernel rows (output filters per tile).
    windows_per_tile : int
        ``Nwin``, micro-kernel columns (output windows per tile).
    dtype : str
        "float32" or "float64".
    vector_lanes : int
        Elements per vector register.
    threads : int
        Workers the plan is for.
    window_parts : int
        WS only: the window tiles are split into this many contiguous parts,
        each a parallel job with each filter block, so that every thread has
        an equal share without re-packing the input (1 for IS, whose K3 is
        capped instead).
    input_in_place : bool
        A 1x1 convolution whose micro-kernel reads the input unpacked
        (:func:`~cso.analysis.tiles.reads_input_in_place`).
    costs : tuple
        ``(("IS", Traffic), ("WS", Traffic))``: the model's figures for both schedules.
    tiles_by_schedule : tuple
        ``(("IS", (Nc, K2, K3)), ("WS", (Nc, K2, K3)))``: each schedule's tiles.
    geometry : ConvGeometry
        The problem this plan was made for.
    hardware : Hardware
        The machine it was made for.
    vector_operand : {"windows", "filters", "reduction"}
        The micro-kernel's vector dimension: windows (the SConv kernel,
        ``Nwin`` a multiple of the lanes), filters (``Nf`` a multiple of the
        lanes, any ``Nwin``; needs every filter packed: ahead of time by
        :func:`cso.pack_filters`, or in the call, a cost the model counts) or
        the reduction (dot products, for a fully connected layer whose one
        window is the whole input, :func:`~cso.analysis.tiles.reads_whole_input_per_window`).
    filters_prepacked : bool
        Planned for filters packed ahead of time (no packing in the call).
    batch_folded : bool
        The batch is folded into the windows: the ``N`` images' ``P*Q``
        windows are one run of ``N*P*Q`` (image after image), tiled as one,
        so that a tile may hold the end of one image and the start of the
        next.  A small plane then fills its last tile with the next image's
        windows instead of padding (49 windows in 14-wide tiles pad 12.5%,
        8 x 49 none), and the jobs are blocks of that run instead of images.
        The model decides where it saves padding
        (:func:`~cso.analysis.tiles.folding_saves_padding`).
    """

    schedule: str
    channel_tile: int
    l2_tiles: int
    l3_tiles: int
    filters_per_tile: int
    windows_per_tile: int
    dtype: str
    vector_lanes: int
    threads: int
    window_parts: int
    input_in_place: bool
    costs: tuple
    tiles_by_schedule: tuple
    geometry: ConvGeometry
    hardware: Hardware
    vector_operand: str = "windows"
    filters_prepacked: bool = False
    batch_folded: bool = False

    @property
    def image_jobs(self) -> int:
        """Images the loop nest takes as separate jobs: ``N``, or 1 when folded."""
        return 1 if self.batch_folded else self.geometry.batch

    @property
    def window_count(self) -> int:
        """Windows of one job's window run: ``P*Q``, or ``N*P*Q`` when folded."""
        return self.geometry.windows * (self.geometry.batch if self.batch_folded else 1)

    def cost_of(self, schedule: str):
        """The modelled :class:`~cso.analysis.cost.Traffic` of ``schedule``."""
        return dict(self.costs)[schedule]

    def explain(self) -> str:
        """The hardware, tiles, cache occupancy, modelled traffic of both
        schedules, the choice and why, and the loop nest with its bounds."""
        from .explain import explain

        return explain(self)

    def to_dict(self) -> dict:
        """Plain JSON-able fields; :meth:`from_dict` rebuilds an equal plan."""
        return {
            "schedule": self.schedule,
            "channel_tile": self.channel_tile,
            "l2_tiles": self.l2_tiles,
            "l3_tiles": self.l3_tiles,
            "filters_per_tile": self.filters_per_tile,
            "windows_per_tile": self.windows_per_tile,
            "dtype": self.dtype,
            "vector_lanes": self.vector_lanes,
            "threads": self.threads,
            "window_parts": self.window_parts,
            "input_in_place": self.input_in_place,
            "costs": {name: traffic.as_dict() for name, traffic in self.costs},
            "tiles_by_schedule": {name: list(ks) for name, ks in self.tiles_by_schedule},
            "geometry": asdict(self.geometry),
            "hardware": asdict(self.hardware),
            "vector_operand": self.vector_operand,
            "filters_prepacked": self.filters_prepacked,
            "batch_folded": self.batch_folded,
        }

    @staticmethod
    def from_dict(fields: dict) -> "Plan":
        """The plan :meth:`to_dict` described (KeyError, TypeError or ValueError if malformed)."""
        return Plan(
            schedule=str(fields["schedule"]),
            channel_tile=int(fields["channel_tile"]),
            l2_tiles=int(fields["l2_tiles"]),
            l3_tiles=int(fields["l3_tiles"]),
            filters_per_tile=int(fields["filters_per_tile"]),
            windows_per_tile=int(fields["windows_per_tile"]),
            dtype=str(fields["dtype"]),
            vector_lanes=int(fields["vector_lanes"]),
            threads=int(fields["threads"]),
            window_parts=int(fields["window_parts"]),
            input_in_place=bool(fields["input_in_place"]),
            costs=tuple((name, Traffic(**fields["costs"][name])) for name in SCHEDULES),
            tiles_by_schedule=tuple(
                (name, tuple(int(k) for k in fields["tiles_by_schedule"][name][:3]))
                for name in SCHEDULES
            ),
            geometry=ConvGeometry(**fields["geometry"]),
            hardware=Hardware(**fields["hardware"]),
            vector_operand=str(fields.get("vector_operand", "windows")),
            filters_prepacked=bool(fields.get("filters_prepacked", False)),
            batch_folded=bool(fields.get("batch_folded", False)),
        )

    def matches(self, geometry: ConvGeometry, dtype) -> bool:
        """Whether this plan was made for ``geometry`` and ``dtype``."""
        return self.geometry == geometry and self.dtype == np.dtype(dtype).name


def _check_tile_override(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


def plan_conv2d(
    x_shape,
    w_shape,
    *,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    dtype=np.float32,
    hardware=None,
    filters_per_tile=None,
    windows_per_tile=None,
    schedule=None,
    threads=None,
    vector_operand=None,
    filters_prepacked=False,
    fold_batch=None,
) -> Plan:
    """Plan a convolution: tiles, their cache distribution and the schedule.

    Parameters
    ----------
    x_shape, w_shape : tuple of 4 ints
        ``(N, C, H, W)`` and ``(K, C // groups, R, S)``.
    stride, padding, dilation, groups
        As for :func:`cso.conv2d`.
    dtype : float32 or float64
        Element type of the computation.
    hardware : Hardware, optional
        The machine to plan for; ``Hardware.detect()`` by default.
    filters_per_tile, windows_per_tile : int, optional
        Override the micro-kernel shape ``Nf x Nwin`` (the vectorised one
        must be a multiple of the vector lanes).
    schedule : {"IS", "WS"}, optional
        Force a schedule instead of the cost model's choice.
    threads : int, optional
        Workers to plan for (default: ``hardware.cores``).
    vector_operand : {"windows", "filters", "reduction"}, optional
        Force the micro-kernel's vector dimension (see :class:`Plan`).
    filters_prepacked : bool, default False
        Whether the filters will be packed ahead of time
        (:func:`cso.pack_filters` says so).  Filter-vectorised kernels need
        every filter packed; without this the model charges that packing to
        the call (``Hardware.filter_pack_cost`` per element, shared by the
        batch), which few batch-1 layers repay.
    fold_batch : bool, optional
        Force folding the batch into the windows (``True``) or computing
        image by image (``False``) instead of the model's choice (see
        :attr:`Plan.batch_folded`).

    Returns
    -------
    Plan
    """
    geometry = make_geometry(
        x_shape, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    hardware = Hardware.detect() if hardware is None else hardware
    if not isinstance(hardware, Hardware):
        raise TypeError(f"hardware must be a cso.Hardware, got {type(hardware).__name__}")
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'IS', 'WS' or None, got {schedule!r}")
    if vector_operand is not None and vector_operand not in VECTOR_OPERANDS:
        raise ValueError(
            "vector_operand must be 'windows', 'filters', 'reduction' or None, "
            f"got {vector_operand!r}"
        )
    threads = hardware.cores if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    if fold_batch not in (None, True, False):
        raise ValueError(f"fold_batch must be True, False or None, got {fold_batch!r}")
    return plan_for_geometry(
        geometry,
        dtype.name,
        hardware,
        _check_tile_override(filters_per_tile, "filters_per_tile"),
        _check_tile_override(windows_per_tile, "windows_per_tile"),
        schedule,
        int(threads),
        vector_operand=vector_operand,
        filters_prepacked=bool(filters_prepacked),
        fold_batch=fold_batch,
    )


@functools.lru_cache(maxsize=1024)
def plan_for_geometry(
    geometry: ConvGeometry,
    dtype_name: str,
    hardware: Hardware,
    filters_per_tile,
    windows_per_tile,
    schedule,
    threads: int,
    *,
    vector_operand=None,
    filters_prepacked=False,
    fold_batch=None,
) -> Plan:
    """:func:`plan_conv2d` on validated arguments (memoised: plans are pure and frozen).

    Every micro-kernel shape of :func:`~cso.analysis.tiles.register_blocks`
    and :func:`~cso.analysis.tiles.filter_vector_blocks`, or the one asked
    for, is planned image by image, and the cheapest is returned, or the
    same shape with the batch folded into the windows when that pads fewer
    columns (:func:`~cso.analysis.tiles.folding_saves_padding`) and costs
    less per image.
    """
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    blocks = {
        "windows": tiles.register_blocks,
        "filters": tiles.filter_vector_blocks,
        "reduction": tiles.dot_product_blocks,
    }
    whole_input = _whole_input_window(geometry)
    if vector_operand == "reduction" and not whole_input:
        raise ValueError(
            "vector_operand='reduction' needs one window covering the whole unpadded input "
            "(a fully connected layer: P*Q = 1, R = H, S = W)"
        )
    operands = [vector_operand] if vector_operand else list(VECTOR_OPERANDS)
    if not whole_input:
        operands = [operand for operand in operands if operand != "reduction"]
    shapes = list(
        dict.fromkeys(
            (filters_per_tile or nf, windows_per_tile or nwin, operand)
            for operand in operands
            for nf, nwin in blocks[operand](
                hardware.vector_bytes, hardware.vector_registers, element_bytes
            )
        )
    )
    for nf, nwin, operand in shapes:
        name, size = (
            ("windows_per_tile", nwin) if operand == "windows" else ("filters_per_tile", nf)
        )
        if operand == "reduction":
            continue
        if size % lanes and (vector_operand or operand == "windows"):
            raise ValueError(
                f"{name} must be a multiple of the vector lanes ({lanes}) when the "
                f"micro-kernel's vectors hold {operand}, got {size}"
            )

    def plan_for(nf, nwin, operand, folded):
        return _plan_for_shape(
            geometry,
            dtype_name,
            hardware,
            nf,
            nwin,
            schedule,
            threads,
            operand,
            filters_prepacked,
            folded,
        )

    def cost_of(plan):
        # Per image either way; a tie keeps the batch image by image.
        return (plan.cost_of(plan.schedule).cost, plan.batch_folded)

    shapes = [
        (nf, nwin, operand)
        for nf, nwin, operand in shapes
        if operand == "reduction" or (nf if operand == "filters" else nwin) % lanes == 0
    ]
    if fold_batch:
        if vector_operand == "reduction":
            raise ValueError(
                "fold_batch=True needs a micro-kernel that tiles windows, not dot products"
            )
        shapes = [shape for shape in shapes if shape[2] != "reduction"]
    best = min((plan_for(*shape, bool(fold_batch)) for shape in shapes), key=cost_of)
    # Folding is weighed for the shape chosen image by image, not across
    # shapes: with the padding gone the model ranks the shapes wrongly (it
    # put 8x32 folded 4% ahead of 32x14 on l3 1x1 1024->256 @14 at batch 8,
    # which ran 1.2x slower; experiments/batch_folding.py).
    nwin, operand = best.windows_per_tile, best.vector_operand
    if (
        fold_batch is None
        and operand != "reduction"
        and tiles.folding_saves_padding(geometry.batch, geometry.windows, nwin)
    ):
        best = min(best, plan_for(best.filters_per_tile, nwin, operand, True), key=cost_of)
    return best


def _plan_for_shape(
    geometry,
    dtype_name,
    hardware,
    nf,
    nwin,
    schedule,
    threads,
    vector_operand="windows",
    filters_prepacked=False,
    folded=False,
) -> Plan:
    """The plan for one micro-kernel shape: each schedule with its cheapest
    channel tile, then the cheaper schedule (or the forced one)."""
    space = _window_space(geometry, folded)
    element_bytes = np.dtype(dtype_name).itemsize
    lanes = max(1, hardware.vector_bytes // element_bytes)
    channels = geometry.channels_per_group
    area = geometry.kernel_height * geometry.kernel_width
    l1 = tiles.usable_bytes(hardware.l1_bytes, hardware.usable_fraction)
    rule_nc = tiles.channel_tile(l1, channels, area, nf, nwin, element_bytes)
    by_schedule, costs = {}, {}
    parts_of = {}
    for name in SCHEDULES:
        # Each schedule takes the channel tile (and, for WS, the way of
        # sharing work between threads) its modelled cost likes best.
        for nc in tiles.channel_tile_candidates(rule_nc, channels):
            for k2, k3, parts in _parallel_options(
                geometry, space, hardware, name, nc, nf, nwin, element_bytes, threads
            ):
                traffic = _traffic(
                    geometry,
                    space,
                    hardware,
                    name,
                    nc,
                    nf,
                    nwin,
                    k2,
                    k3,
                    element_bytes,
                    parts,
                    vector_operand,
                    filters_prepacked,
                    threads,
                )
                if name not in costs or traffic.cost < costs[name].cost:
                    costs[name], by_schedule[name] = traffic, (nc, k2, k3)
                    parts_of[name] = parts
    chosen = schedule or min(SCHEDULES, key=lambda name: (costs[name].cost, name != "IS"))
    nc, k2, k3 = by_schedule[chosen]
    window_parts = parts_of[chosen]
    return Plan(
        schedule=chosen,
        channel_tile=nc,
        l2_tiles=k2,
        l3_tiles=k3,
        filters_per_tile=nf,
        windows_per_tile=nwin,
        dtype=dtype_name,
        vector_lanes=lanes,
        threads=int(threads),
        window_parts=window_parts,
        input_in_place=vector_operand == "reduction"
        or _input_in_place(geometry, element_bytes, hardware),
        costs=tuple((name, costs[name]) for name in SCHEDULES),
        tiles_by_schedule=tuple((name, by_schedule[name]) for name in SCHEDULES),
        geometry=geometry,
        hardware=hardware,
        vector_operand=vector_operand,
        filters_prepacked=bool(filters_prepacked),
        batch_folded=bool(folded),
    )


class _WindowSpace(NamedTuple):
    """One job's windows: ``images`` images' ``P*Q`` each, in ``outer_jobs``
    (group, image) jobs; the batch folded makes it all images in one job."""

    outer_jobs: int
    images: int
    windows: int


def _window_space(geometry, folded) -> _WindowSpace:
    if folded:
        return _WindowSpace(geometry.groups, geometry.batch, geometry.batch * geometry.windows)
    return _WindowSpace(geometry.groups * geometry.batch, 1, geometry.windows)


def _cache_tiles(geometry, space, hardware, schedule, nc, nf, nwin, element_bytes, threads):
    """``(K2, K3)`` of ``schedule`` for channel tile ``nc``: the L2 and L3 rules,
    with K3 capped so that every thread gets a block."""
    area = geometry.kernel_height * geometry.kernel_width
    window_tiles = ceil_div(space.windows, nwin)
    filter_tiles = ceil_div(geometry.filters_per_group, nf)
    in_bytes = tiles.input_tile_bytes(nc, area, nwin, element_bytes)
    fs_bytes = tiles.filter_tile_bytes(nc, area, nf, element_bytes)
    out_bytes = tiles.output_tile_bytes(nwin, nf, element_bytes)
    # The K2 and K3 blocks are swept cyclically: they get a share of the usable bytes.
    l2 = tiles.usable_bytes(hardware.l2_bytes, hardware.usable_fraction * hardware.sweep_fraction)
    l3 = tiles.usable_bytes(hardware.l3_bytes, hardware.usable_fraction * hardware.sweep_fraction)
    if schedule == "IS":
        resident, streamed, resident_count, streamed_count = (
            in_bytes,
            fs_bytes,
            window_tiles,
            filter_tiles,
        )
    else:
        resident, streamed, resident_count, streamed_count = (
            fs_bytes,
            in_bytes,
            filter_tiles,
            window_tiles,
        )
    k2 = tiles.l2_tiles(l2, resident, streamed, out_bytes, streamed_count)
    k3 = tiles.l3_tiles(l3, resident, streamed, out_bytes, k2, resident_count)
    return k2, k3


def _whole_input_window(geometry) -> bool:
    padded = geometry.pad_top or geometry.pad_bottom or geometry.pad_left or geometry.pad_right
    return tiles.reads_whole_input_per_window(
        geometry.kernel_height,
        geometry.kernel_width,
        geometry.height,
        geometry.width,
        padded,
        geometry.windows,
        (geometry.dilation_h, geometry.dilation_w) != (1, 1),
    )


def _input_in_place(geometry, element_bytes, hardware) -> bool:
    padded = geometry.pad_top or geometry.pad_bottom or geometry.pad_left or geometry.pad_right
    return tiles.reads_input_in_place(
        geometry.kernel_height,
        geometry.kernel_width,
        (geometry.stride_h, geometry.stride_w) != (1, 1),
        padded,
        geometry.height * geometry.width * element_bytes,
        hardware.page_bytes,
    )


def _parallel_options(geometry, space, hardware, schedule, nc, nf, nwin, element_bytes, threads):
    """``(K2, K3, window_parts)`` ways to give every thread a job.

    The jobs are (group, image, stationary block[, window part]).  When the
    outer jobs are fewer than the threads, K3 shrinks to make more blocks;
    WS may instead keep K3 and split its windows into parts (no re-packing,
    but every part streams all of its filter block).  The cost model chooses.
    """
    k2, k3 = _cache_tiles(geometry, space, hardware, schedule, nc, nf, nwin, element_bytes, threads)
    share = max(1, ceil_div(threads, space.outer_jobs))
    window_tiles = ceil_div(space.windows, nwin)
    filter_tiles = ceil_div(geometry.filters_per_group, nf)
    resident_count = window_tiles if schedule == "IS" else filter_tiles
    options = [(k2, min(k3, tiles.parallel_cap(resident_count, share)), 1)]
    if schedule == "WS":
        parts = _ws_window_parts(geometry, space, nf, nwin, k3, threads)
        if parts > 1:
            options.append((k2, k3, parts))
    return options


def _ws_window_parts(geometry, space, nf, nwin, k3, threads) -> int:
    """WS's window parts for filter blocks of ``k3`` tiles (:func:`tiles.window_parts`)."""
    return tiles.window_parts(
        threads,
        space.outer_jobs,
        ceil_div(ceil_div(geometry.filters_per_group, nf), k3),
        ceil_div(space.windows, nwin),
    )


def _traffic(
    geometry,
    space,
    hardware,
    schedule,
    nc,
    nf,
    nwin,
    k2,
    k3,
    element_bytes,
    window_parts=1,
    vector_operand="windows",
    filters_prepacked=False,
    threads=1,
):
    return cost.schedule_traffic(
        schedule,
        channels=geometry.channels_per_group,
        kernel_area=geometry.kernel_height * geometry.kernel_width,
        height=geometry.height,
        width=geometry.width,
        filters=geometry.filters_per_group,
        windows=geometry.windows,
        channel_tile=nc,
        filters_per_tile=nf,
        windows_per_tile=nwin,
        k2=k2,
        k3=k3,
        element_bytes=element_bytes,
        hardware=hardware,
        window_parts=window_parts,
        vector_operand=vector_operand,
        filters_prepacked=filters_prepacked,
        batch=geometry.batch,
        input_in_place=vector_operand == "reduction"
        or _input_in_place(geometry, element_bytes, hardware),
        threads=threads,
        outer_jobs=space.outer_jobs,
        images=space.images,
    )


def with_tiles(
    plan: Plan, *, schedule=None, channel_tile=None, l2_tiles=None, l3_tiles=None
) -> Plan:
    """``plan`` with some decisions replaced (as the autotuner tries them).

    The schedule's ``Nc``, ``K2`` and ``K3`` change as given; the model's
    costs are recomputed for the new tiles, so ``plan.costs`` keeps describing
    the plan it belongs to.  Values are bounded like the rules'
    (``1 <= Nc <= C``, ``1 <= K2, K3``).
    """
    schedule = plan.schedule if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'IS' or 'WS', got {schedule!r}")
    g = plan.geometry
    by_schedule = dict(plan.tiles_by_schedule)
    nc, k2, k3 = by_schedule[schedule]
    nc = max(1, min(int(channel_tile if channel_tile is not None else nc), g.channels_per_group))
    k2 = max(1, int(l2_tiles if l2_tiles is not None else k2))
    k3 = max(1, int(l3_tiles if l3_tiles is not None else k3))
    by_schedule[schedule] = (nc, k2, k3)
    element_bytes = np.dtype(plan.dtype).itemsize
    space = _window_space(g, plan.batch_folded)
    window_parts = 1
    if schedule == "WS":
        window_parts = _ws_window_parts(
            g, space, plan.filters_per_tile, plan.windows_per_tile, k3, plan.threads
        )
    costs = tuple(
        (
            name,
            _traffic(
                g,
                space,
                plan.hardware,
                name,
                by_schedule[name][0],
                plan.filters_per_tile,
                plan.windows_per_tile,
                *by_schedule[name][1:],
                element_bytes,
                window_parts if name == schedule else 1,
                plan.vector_operand,
                plan.filters_prepacked,
                plan.threads,
            ),
        )
        for name in SCHEDULES
    )
    return dataclasses.replace(
        plan,
        schedule=schedule,
        channel_tile=nc,
        l2_tiles=k2,
        l3_tiles=k3,
        window_parts=window_parts,
        costs=costs,
        tiles_by_schedule=tuple((name, by_schedule[name]) for name in SCHEDULES),
    )
