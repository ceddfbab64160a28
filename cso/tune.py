"""The autotuner.

``tune`` enumerates plans around the analysis' choice (both schedules,
channel tiles, L2/L3 tile counts, micro-kernel shapes), ranks them by the
cost model, and times them in that order on random data until the budget is
spent; the analysis' own plan is always timed first, so the result is never
worse than it.  With ``store``, the winner goes into the tuned-plans store
(:mod:`cso.tuned_store`), which ``cso.conv2d(..., tuned=True)`` consults.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from . import executor
from .analysis import tiles
from .analysis.choices import SCHEDULES, KCRS_ALGORITHMS, Algorithm, Schedule, VectorOperand
from .analysis.families import FAMILIES
from .analysis.plan import Plan
from .analysis.planner import plan_conv2d, plan_for_geometry
from .analysis.retile import with_tiles
from .checks import check_threads
from .measure import best_times, kernel_name, plan_program
from .tuned_store import TunedPlans


def describe_plan(plan: Plan) -> str:
    """``dense 14x32w WS Nc=64 K2=7 K3=8``: the family, its kernel
    (:func:`cso.measure.kernel_name`), and a dense plan's schedule and tiles."""
    text = f"{plan.algorithm.value} {kernel_name(plan)}"
    if plan.algorithm == Algorithm.DENSE:
        text += f" {plan.schedule} Nc={plan.channel_tile} K2={plan.l2_tiles} K3={plan.l3_tiles}"
    return text


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan the tuner considered: its modelled cost and, if timed, its best time."""

    plan: Plan
    modelled_cost: float
    seconds: float | None
    origin: str

    def describe(self) -> str:
        return describe_plan(self.plan)

    def __repr__(self) -> str:
        timed = "not timed" if self.seconds is None else f"{self.seconds * 1e3:.4g} ms"
        return (
            f"Candidate({self.describe()}, {self.origin}, modelled cost "
            f"{self.modelled_cost:.4g}, {timed})"
        )


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The best plan found, and every candidate with its time (None: not timed)."""

    best: Plan
    analysis: Plan
    candidates: tuple

    @property
    def best_seconds(self) -> float:
        return min(c.seconds for c in self.candidates if c.seconds is not None)

    @property
    def analysis_seconds(self) -> float:
        return next(c.seconds for c in self.candidates if c.origin == "analysis")

    def __repr__(self) -> str:
        # A line, not every candidate plan in full (tens of kilobytes): table()
        # lists them, and best, analysis and candidates hold them.
        timed = [c for c in self.candidates if c.seconds is not None]
        best = describe_plan(self.best)
        if not timed:
            return f"TuneResult(best={best}, {len(self.candidates)} candidates, none timed)"
        return (
            f"TuneResult(best={best} in {self.best_seconds * 1e3:.4g} ms, "
            f"{len(self.candidates)} candidates ({len(timed)} timed))"
        )

    def table(self) -> str:
        """The candidates, timed ones first (fastest first), as text."""
        rows = sorted(
            self.candidates, key=lambda c: (c.seconds is None, c.seconds or 0.0, c.modelled_cost)
        )
        lines = [f"{'candidate':<48} {'origin':<10} {'model cost':>12} {'time ms':>9}"]
        for c in rows:
            timed = "-" if c.seconds is None else f"{c.seconds * 1e3:.3f}"
            lines.append(f"{c.describe():<48} {c.origin:<10} {c.modelled_cost:>12.4g} {timed:>9}")
        return "\n".join(lines)


def _around(value: int, limit: int) -> list:
    """``value`` and its neighbours by factors of two, within ``1 .. limit``."""
    options = {value, value // 2, value * 2, limit}
    return sorted(v for v in options if 1 <= v <= limit)


def candidate_plans(analysis: Plan, micro_kernels) -> list:
    """Every plan the tuner may try, with where it came from.

    ``micro_kernels`` holds ``(Nf, Nwin, vector_operand)`` triples.  Each
    is tried image by image and, where that saves padding, with the batch
    folded into the windows.
    """
    g = analysis.geometry
    found = {}
    for nf, nwin, operand in micro_kernels:
        own = (analysis.filters_per_tile, analysis.windows_per_tile, analysis.vector_operand)
        folds = [None]
        saves = tiles.folding_saves_padding(g.batch, g.windows, nwin)
        if operand != VectorOperand.REDUCTION and saves:
            folds = [False, True]
        for fold in folds:
            _add_candidates(found, analysis, own, nf, nwin, operand, fold)
    return list(found.values())


def _add_candidates(found, analysis, own, nf, nwin, operand, fold) -> None:
    """Into ``found``: the plans around the model's for one micro-kernel shape
    (``fold``: the batch folded or not; None, the model's choice)."""
    g = analysis.geometry
    if (nf, nwin, operand) == own and fold in (None, analysis.batch_folded):
        base = analysis
    else:
        base = plan_for_geometry(
            g,
            analysis.dtype,
            analysis.hardware,
            nf,
            nwin,
            None,
            analysis.threads,
            vector_operand=operand,
            fold_batch=fold,
        )
    window_tiles = -(-base.window_count // nwin)
    filter_tiles = -(-g.filters_per_group // nf)
    for schedule in SCHEDULES:
        nc_model, k2_rule, k3_rule = dict(base.tiles_by_schedule)[schedule]
        streamed, resident = (
            (filter_tiles, window_tiles)
            if schedule == Schedule.IS
            else (window_tiles, filter_tiles)
        )
        for nc in _around(nc_model, g.channels_per_group):
            for k2 in _around(k2_rule, streamed):
                for k3 in _around(k3_rule, resident):
                    plan = with_tiles(
                        base, schedule=schedule, channel_tile=nc, l2_tiles=k2, l3_tiles=k3
                    )
                    key = (schedule, nc, k2, k3, nf, nwin, operand, plan.batch_folded)
                    origin = "analysis" if plan == analysis else "variant"
                    if key not in found or origin == "analysis":
                        found[key] = (plan, origin)


def _interleaved(pool) -> list:
    """The analysis' plan, then the others by modelled cost, taking turns between
    (schedule, micro-kernel) families so that a short budget still samples each."""

    def cost(item):
        return item[0].cost_of(item[0].schedule).cost

    first = [item for item in pool if item[1] == "analysis"]
    families = {}
    for item in sorted((item for item in pool if item[1] != "analysis"), key=cost):
        plan = item[0]
        family = (
            plan.schedule,
            plan.filters_per_tile,
            plan.windows_per_tile,
            plan.vector_operand,
            plan.batch_folded,
        )
        families.setdefault(family, []).append(item)
    queues = sorted(families.values(), key=lambda queue: cost(queue[0]))
    ordered = []
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    return first + ordered


def tune(
    x_shape,
    w_shape,
    *,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    dtype=np.float32,
    threads=None,
    budget_s=10.0,
    hardware=None,
    micro_kernels=None,
    store=None,
    seed=0,
) -> TuneResult:
    """Search plans for one convolution by timing them; return the best.

    Parameters
    ----------
    x_shape, w_shape, stride, padding, dilation, groups, dtype
        The problem, as for :func:`cso.plan_conv2d`.
    threads : int, optional
        Worker threads to time with (default: all).
    budget_s : float
        Wall-clock budget, compilation included.  Candidates are timed in the
        order of their modelled cost; the analysis' plan always first.
    hardware : Hardware, optional
        The description the plans are made from (default: this machine).
    micro_kernels : iterable of (Nf, Nwin), optional
        Window-vectorised micro-kernel shapes to try besides the analysis'
        own kernel (default: those the analysis chooses among, and the
        filter-vectorised 32x14 with its per-call filter packing).  A new
        shape costs a compilation the first time.
    store : bool, str or path-like, optional
        Save the best plan to the tuned-plans store (True: the default file).
    seed : int
        Seed of the random data timed on.

    Returns
    -------
    TuneResult
    """
    if budget_s is None or not budget_s > 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    threads = check_threads(threads, executor.available_threads())
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    analysis = plan_conv2d(
        x_shape, w_shape, dtype=dtype, hardware=hardware, threads=threads, **params
    )
    hw = analysis.hardware
    element_bytes = np.dtype(dtype).itemsize
    others = [
        (nf, nwin, VectorOperand.FILTERS)
        for nf, nwin in tiles.filter_vector_blocks(
            hw.vector_bytes, hw.vector_registers, element_bytes
        )
    ]
    if micro_kernels is None:
        micro_kernels = tiles.register_blocks(hw.vector_bytes, hw.vector_registers, element_bytes)
    else:
        others = []
    shapes = [(int(nf), int(nwin)) for nf, nwin in micro_kernels]
    for nf, nwin in shapes:
        if nf < 1 or nwin < 1 or nwin % analysis.vector_lanes:
            raise ValueError(
                f"micro_kernels: ({nf}, {nwin}) needs Nf >= 1 and Nwin a multiple "
                f"of {analysis.vector_lanes}"
            )
    windows = [(nf, nwin, VectorOperand.WINDOWS) for nf, nwin in shapes]
    # Dense candidates around the dense analysis: the analysis' own plan, or
    # for a depthwise plan, the dense plan it was weighed against.
    base = analysis
    if analysis.algorithm in KCRS_ALGORITHMS:
        base = plan_for_geometry(
            analysis.geometry, analysis.dtype, hw, None, None, None, threads,
            algorithm=Algorithm.DENSE,
        )  # fmt: skip
    own = (base.filters_per_tile, base.windows_per_tile, base.vector_operand)
    kernels = list(dict.fromkeys([own] + windows + others))
    pool = candidate_plans(base, kernels)
    if base is not analysis:
        # The analysis' plan, the other families that run the layer (tap,
        # lane, plane, row: analysis.families), then the dense variants.
        siblings = [
            name
            for name, family in FAMILIES.items()
            if name != analysis.algorithm and family.runs(analysis.geometry)
        ]
        others = [
            plan_for_geometry(
                analysis.geometry,
                analysis.dtype,
                hw,
                None,
                None,
                None,
                threads,
                algorithm=algorithm,
            )  # fmt: skip
            for algorithm in siblings
        ]
        pool = [(analysis, "analysis")] + [
            (plan, "variant") for plan in others + [p for p, _ in pool]
        ]
    ranked = _interleaved(pool)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    deadline = time.perf_counter() + budget_s
    candidates = []
    for plan, origin in ranked:
        seconds = None
        if origin == "analysis" or time.perf_counter() < deadline:
            program = plan_program(plan, x, w)
            program()  # compiles a new shape once
            seconds = best_times({"plan": program}, rounds=3, min_seconds=0.05)["plan"]
        candidates.append(Candidate(plan, plan.cost_of(plan.schedule).cost, seconds, origin))
    best = min((c for c in candidates if c.seconds is not None), key=lambda c: c.seconds).plan
    if store:
        TunedPlans(None if store is True else store).put(best)
    return TuneResult(best=best, analysis=analysis, candidates=tuple(candidates))
