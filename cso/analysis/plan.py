"""The plan: every decision the analysis makes for one convolution, frozen.

A :class:`Plan` names the algorithm's choices (schedule, micro-kernel shape
and orientation, tiles), the layout decisions the loop nests obey (input
read in place or packed channel by channel, batch folded), and the thread
count; the executor derives nothing of its own.  :mod:`.planner` makes
plans; :func:`cso.analysis.explain.explain` tells their story.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from .choices import SCHEDULES, Algorithm, Schedule, VectorOperand
from .pricing import Traffic
from .hardware import Hardware
from .plan_checks import check_plan_fields
from .tiles import packs_filters_in_nest


@dataclass(frozen=True)
class Plan:
    """How cso computes one convolution.

    Attributes
    ----------
    schedule : Schedule
        Input-stationary (``"IS"``) or weight-stationary (``"WS"``) loop nest.
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
        The micro-kernel reads the input unpacked: a 1x1, stride-1,
        unpadded convolution with small planes
        (:func:`~cso.analysis.tiles.reads_input_in_place`), or a dot-product
        plan whose one window is the whole input.
    algorithm : Algorithm
        The algorithm family: ``"dense"`` (the fields above describe its
        outer-product tiles) or ``"depthwise"`` (one input channel per
        group: ``windows_per_tile`` is the tap kernel's row segment, ``Nv``
        vectors of ``vector_lanes``, and ``rows_per_call`` its rows; the
        dense tiles are 1).
    rows_per_call : int
        Depthwise only: output rows one tap-kernel call holds in registers,
        each input vector it loads feeding every row that reads it
        (:mod:`cso.microkernels.taps`); 1 for the one-row kernel.
    pack_channels_outer : bool
        The input panels are packed a block of tiles at a time, channel by
        channel (the other 1x1, stride-1, unpadded plans:
        :func:`~cso.analysis.tiles.packs_channels_outer`).
    costs : tuple
        ``(("IS", Traffic), ("WS", Traffic))``: the model's figures for both schedules.
    tiles_by_schedule : tuple
        ``(("IS", (Nc, K2, K3)), ("WS", (Nc, K2, K3)))``: each schedule's tiles.
    geometry : ConvGeometry
        The problem this plan was made for.
    hardware : Hardware
        The machine it was made for.
    vector_operand : VectorOperand
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

    schedule: Schedule
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
    vector_operand: VectorOperand = VectorOperand.WINDOWS
    filters_prepacked: bool = False
    batch_folded: bool = False
    pack_channels_outer: bool = False
    algorithm: Algorithm = Algorithm.DENSE
    rows_per_call: int = 1

    def __post_init__(self):
        # A plan whose fields the code cannot run must not exist: the loop
        # nests obey it without checking again, and plans also come from files.
        check_plan_fields(self)

    @property
    def image_jobs(self) -> int:
        """Images the loop nest takes as separate jobs: ``N``, or 1 when folded."""
        return 1 if self.batch_folded else self.geometry.batch

    @property
    def window_count(self) -> int:
        """Windows of one job's window run: ``P*Q``, or ``N*P*Q`` when folded."""
        return self.geometry.windows * (self.geometry.batch if self.batch_folded else 1)

    @functools.cached_property
    def packs_filters_in_nest(self) -> bool:
        """Each filter tile is packed in the loop nest just before its use, not
        all of them up front (:func:`~cso.analysis.tiles.packs_filters_in_nest`).
        Kept once worked out: every call of a filter-vectorised plan asks
        (0.5 of the 1.6 microseconds its filter operands took)."""
        return packs_filters_in_nest(
            self.schedule, self.vector_operand, self.filters_prepacked, self.window_parts,
            self.image_jobs, self.l2_tiles, ceil_div(self.window_count, self.windows_per_tile),
        )  # fmt: skip

    def cost_of(self, schedule: str):
        """The modelled :class:`~cso.analysis.pricing.Traffic` of ``schedule``."""
        return dict(self.costs)[schedule]

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
            "hardware": self.hardware.to_dict(),
            "vector_operand": self.vector_operand,
            "filters_prepacked": self.filters_prepacked,
            "batch_folded": self.batch_folded,
            "pack_channels_outer": self.pack_channels_outer,
            "algorithm": self.algorithm,
            "rows_per_call": self.rows_per_call,
        }

    @staticmethod
    def from_dict(fields: dict) -> "Plan":
        """The plan :meth:`to_dict` described (KeyError, TypeError or ValueError if malformed)."""
        return Plan(
            schedule=Schedule(fields["schedule"]),
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
            hardware=Hardware.from_dict(fields["hardware"]),
            vector_operand=VectorOperand(fields.get("vector_operand", "windows")),
            filters_prepacked=bool(fields.get("filters_prepacked", False)),
            batch_folded=bool(fields.get("batch_folded", False)),
            pack_channels_outer=bool(fields.get("pack_channels_outer", False)),
            algorithm=Algorithm(fields.get("algorithm", "dense")),
            rows_per_call=int(fields.get("rows_per_call", 1)),
        )

    def matches(self, geometry: ConvGeometry, dtype) -> bool:
        """Whether this plan was made for ``geometry`` and ``dtype``."""
        return self.geometry == geometry and self.dtype == dtype_name(dtype)


# NumPy works a dtype's name out in Python each time (1.2 microseconds of a
# 12-microsecond conv2d call given a plan): the two a plan can have are kept.
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}


def dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, looked up for the dtypes a plan can have."""
    name = _DTYPE_NAMES.get(dtype) if isinstance(dtype, np.dtype) else None
    return name if name is not None else np.dtype(dtype).name


def check_plan(plan, geometry: ConvGeometry, dtype) -> None:
    """Raise unless ``plan`` is a :class:`Plan` made for ``geometry`` in ``dtype``.

    Raises
    ------
    TypeError
        When ``plan`` is not a :class:`Plan`.
    ValueError
        When it was made for another problem or dtype.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a cso.Plan, got {type(plan).__name__}")
    if not plan.matches(geometry, dtype):
        raise ValueError(
            "plan was made for another problem: expected a plan for "
            f"{geometry} in {np.dtype(dtype).name}, got one for {plan.geometry} in {plan.dtype}"
        )
