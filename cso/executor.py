"""The executor: runs a plan's loop nest on operands prepared for it.

Below the public call (:mod:`cso.conv`) and above the loop nests
(:mod:`cso.macrokernel`): it prepares the filter operands a
:class:`~cso.analysis.plan.Plan`'s micro-kernel reads and runs the plan's
launch (:mod:`cso.launch`: its loop nest, bounds and workspace).  It
decides nothing: every layout choice and the thread count are the plan's.

The steps are public so that measurements can run a given plan, or a
variant of its loop nest, exactly as a call does::

    filters = filter_operands(w, bias, plan)
    run(plan, x, filters, y)                        # what cso.conv2d does
    run(plan, x, filters, y, epilogue=Epilogue(activation_code("relu"), residual))
    run(plan, x, filters, y, cso.launch.launch_for(plan, filters.packed, module))  # a variant
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numba
import numpy as np

try:  # where Numba keeps its thread-count getter (numba_thread_count)
    from numba.np.ufunc import parallel as _numba_parallel
except ImportError:  # pragma: no cover - a Numba without the module
    _numba_parallel = None

from .analysis.choices import KCRS_ALGORITHMS, Algorithm, VectorOperand
from .analysis.plan import Plan
from .geometry import ceil_div
from .launch import Launch, launch_for
from .openmp import kept_openmp_threads
from .packing.filters import (
    pack_bias,
    pack_edge_filter_rows,
    pack_edge_filters,
    pack_filters_panels,
)
from .workspace import placeholder, workspace


def available_threads() -> int:
    """Workers a call may run: Numba's thread pool (one per core by default)."""
    return numba.config.NUMBA_NUM_THREADS


class FilterOperands(NamedTuple):
    """The filters and bias as a plan's loop nest reads them.

    ``array`` is the KCRS filters flattened and read in place with
    ``edge`` the packed last tiles (``packed`` False), or the full panels
    (``packed`` True, ``edge`` their first tile); ``bias`` is the bias
    panel ``[G][T_f*Nf]`` (zeros when ``has_bias`` is False).
    """

    array: np.ndarray
    edge: np.ndarray
    packed: bool
    bias: np.ndarray
    has_bias: bool


def filter_operands(w, bias, plan: Plan) -> FilterOperands:
    """Prepare KCRS filters ``w`` and ``bias`` (or None) for ``plan``.

    Window-vectorised and dot-product kernels read the filters in place
    from KCRS, a last, partial tile included (see :func:`_edge_filters`).
    A filter-vectorised kernel loads vectors along the filters, so every
    tile is packed, in the call unless packed ahead of time
    (:func:`cso.pack_filters`, then :func:`prepacked_operands`): by the loop
    nest tile by tile where the plan says so (``Plan.packs_filters_in_nest``;
    it then gets the KCRS filters), else up front
    (:func:`pack_panels_up_front`).
    """
    dtype = np.dtype(plan.dtype)
    if plan.algorithm in KCRS_ALGORITHMS:
        # The tap and lane nests read each filter's taps from KCRS in place.
        return _depthwise_operands(flat_operand(w, dtype), bias, plan)
    zero_bias, edge = plan_constants(plan)
    bias_panel = zero_bias if bias is None else _bias_panel(bias, plan)
    if packs_panels_up_front(plan):
        panels = pack_panels_up_front(w, plan)
        return FilterOperands(
            panels, panels[: plan.filters_per_tile], True, bias_panel, bias is not None
        )
    # Read in place, or packed tile by tile by the loop nest, from KCRS.
    w_flat = flat_operand(w, dtype)
    if edge is None:
        edge = _edge_filters(w_flat, plan)
    return FilterOperands(w_flat, edge, False, bias_panel, bias is not None)


def packs_panels_up_front(plan: Plan) -> bool:
    """Whether :func:`filter_operands` packs ``plan``'s filter panels before
    its loop nest runs (``FilterOperands.packed``): a dense filter-vectorised
    plan that does not pack them tile by tile in its nest."""
    return (
        plan.algorithm not in KCRS_ALGORITHMS
        and plan.vector_operand == VectorOperand.FILTERS
        and not plan.packs_filters_in_nest
    )


def pack_panels_up_front(w, plan: Plan) -> np.ndarray:
    """Every filter panel of a filter-vectorised ``plan`` that does not pack
    them in its loop nest, packed before the nest runs into the calling
    thread's kept filter buffer (fresh panels page-fault), valid until its
    next packing.  One thread packs with no parallel region and no thread
    settings to change and restore: a small layer's packing took 9.7
    microseconds that way, 4 without."""
    dtype = np.dtype(plan.dtype)
    parallel = plan.threads > 1
    with numba_threads(plan.threads) if parallel else contextlib.nullcontext():
        return pack_filters_panels(
            np.asarray(w), plan.geometry.groups, plan.filters_per_tile, dtype,
            plan.vector_lanes, scratch=lambda elements: workspace(elements, dtype, role="filters"),
            parallel=parallel,
        )  # fmt: skip


# Per plan, what its filter operands hold whatever the filters: see plan_constants.
_constants: dict = {}


def plan_constants(plan: Plan) -> tuple:
    """``(zero bias panel, edge filters or None)`` for ``plan``: the bias panel
    of a call without a bias, and the edge operand when it is a placeholder
    (no group has fewer than ``Nf`` filters), else None (it depends on the
    filters).  Memoised by the plan object's identity, as its launch is
    (:func:`~cso.launch.launch_for`): a small call's filter operands took 1.5
    microseconds worked out anew each time."""
    entry = _constants.get(id(plan))
    if entry is not None and entry[0] is plan:
        return entry[1]
    g = plan.geometry
    edge = None
    # Never read where no tile is an edge tile read from KCRS: a group of at
    # least Nf filters, or every tile packed by the loop nest.
    if g.filters_per_group >= plan.filters_per_tile or plan.packs_filters_in_nest:
        edge = placeholder(plan.filters_per_tile, plan.dtype)
    constants = (_bias_panel(None, plan), edge)
    if len(_constants) >= 1024:
        _constants.clear()  # plans are few per process; this only bounds a pathological one
    _constants[id(plan)] = (plan, constants)
    return constants


def prepacked_operands(panels: np.ndarray, bias, plan: Plan) -> FilterOperands:
    """Operands from filters packed ahead of time for ``plan``'s micro-kernel
    (:func:`cso.pack_filters`): ``panels`` and the packed ``bias`` or None.

    Dot-product panels are the KCRS rows, read in place with their last
    partial tile packed as rows; a Winograd plan's are its transformed
    filters (``packed``: the nest then transforms none); other panels are
    read whole.
    """
    if plan.algorithm == Algorithm.WINOGRAD:
        return _depthwise_operands(panels, bias, plan)._replace(packed=True)
    if plan.algorithm in KCRS_ALGORITHMS:
        return _depthwise_operands(panels, bias, plan)
    has_bias = bias is not None
    # Without a bias, the shared zeros of a full bias panel's size: the
    # micro-kernels load their bias row either way.
    bias_panel = bias if has_bias else _bias_panel(None, plan)
    if not reads_whole_panels(plan, prepacked=True):
        return FilterOperands(panels, _edge_filters(panels, plan), False, bias_panel, has_bias)
    return FilterOperands(panels, panels[: plan.filters_per_tile], True, bias_panel, has_bias)


def reads_whole_panels(plan: Plan, prepacked: bool) -> bool:
    """``FilterOperands.packed`` of ``plan``'s operands, which picks its
    launch (:func:`~cso.launch.launch_for`): from :func:`prepacked_operands`
    (``prepacked``), every panel but the KCRS rows of the tap, lane, plane,
    row and dot-product plans (a Winograd plan's transformed filters
    included); from :func:`filter_operands`, the panels packed up front
    (:func:`packs_panels_up_front`)."""
    if not prepacked:
        return packs_panels_up_front(plan)
    if plan.algorithm == Algorithm.WINOGRAD:
        return True
    return plan.algorithm not in KCRS_ALGORITHMS and plan.vector_operand != VectorOperand.REDUCTION


def _depthwise_operands(w_flat, bias, plan: Plan) -> FilterOperands:
    """KCRS filters and the ``(K,)`` bias (a zero placeholder without one)."""
    dtype = np.dtype(plan.dtype)
    zeros = placeholder(1, dtype)
    if bias is None:
        return FilterOperands(w_flat, zeros, False, zeros, False)
    return FilterOperands(w_flat, zeros, False, flat_operand(bias, dtype), True)


def bias_is_its_panel(plan: Plan) -> bool:
    """Whether a ``(K,)`` bias, flat, is already its ``[G][T_f*Nf]`` panel
    for ``plan``: each group's filters fill whole tiles, so no padding falls
    between the groups' biases."""
    return plan.geometry.filters_per_group % plan.filters_per_tile == 0


def _bias_panel(bias, plan: Plan):
    """``bias`` packed as ``[G][T_f*Nf]`` (the bias as given where it is its
    own panel: the nests only read it); without one, shared zeros (the
    micro-kernels load the bias row either way, and add it only when there
    is a bias)."""
    g = plan.geometry
    if bias is None:
        padded = ceil_div(g.filters_per_group, plan.filters_per_tile) * plan.filters_per_tile
        return placeholder(g.groups * padded, plan.dtype)
    if bias_is_its_panel(plan):
        return flat_operand(bias, np.dtype(plan.dtype))
    return pack_bias(bias, g.filters, g.groups, plan.filters_per_tile, np.dtype(plan.dtype))


def _edge_filters(w_flat, plan: Plan):
    """The packed last filter tile of each group, for filters read in place.

    Only groups of fewer than ``Nf`` filters need it: otherwise the loop
    nests read a last, partial tile as the ``Nf`` KCRS rows that end at
    ``K_g`` and keep its own rows, and this is a placeholder never read.
    """
    g = plan.geometry
    if g.filters_per_group >= plan.filters_per_tile:
        return placeholder(plan.filters_per_tile, w_flat.dtype)
    pack_edge = (
        pack_edge_filter_rows
        if plan.vector_operand == VectorOperand.REDUCTION
        else pack_edge_filters
    )
    return pack_edge(
        w_flat, g.groups, g.filters_per_group, g.reduction_length, plan.filters_per_tile
    )


class Epilogue(NamedTuple):
    """What a call fuses into its output tiles' write-back:
    ``y = act(conv + bias + residual)``.

    ``activation`` is :func:`~cso.analysis.choices.activation_code`'s number
    (0: none); ``residual`` is None or an array of the output's shape, dtype
    and layout (C-contiguous) that shares no memory with the output.
    """

    activation: int = 0
    residual: np.ndarray = None


NO_EPILOGUE = Epilogue()


def epilogue_for(activation: int, residual, y) -> Epilogue:
    """The epilogue for output ``y``: the residual in ``y``'s dtype and layout,
    copied when it shares memory with ``y`` (the loop nests write partial
    sums into ``y`` before they read the residual)."""
    if residual is None:
        return Epilogue(activation) if activation else NO_EPILOGUE
    if np.shares_memory(residual, y):
        residual = residual.astype(y.dtype, order="C", copy=True)
    else:
        residual = writeable(np.ascontiguousarray(residual, dtype=y.dtype))
    return Epilogue(activation, residual)


def run(
    plan: Plan,
    x,
    filters: FilterOperands,
    y: np.ndarray,
    launch: Launch = None,
    epilogue: Epilogue = NO_EPILOGUE,
):
    """Drive ``plan``'s loop nest on ``plan.threads`` workers; ``y`` is overwritten.

    ``x`` is the input as given (made C-contiguous in ``y``'s dtype when
    it is not), ``filters`` from :func:`filter_operands` or
    :func:`prepacked_operands`, ``launch`` the plan's own unless given
    (:func:`launch_for`), ``epilogue`` what the write-back fuses.
    """
    if launch is None:
        launch = launch_for(plan, filters.packed)
    launch_nest(plan, launch, loop_arguments(launch, x, filters, y, epilogue))
    return y


def launch_nest(plan: Plan, launch: Launch, arguments: tuple) -> None:
    """Call ``launch``'s loop nest on ``arguments`` (:func:`loop_arguments`)
    with ``plan.threads`` workers, leaving the process's thread settings as
    they were."""
    # A one-thread plan runs its nest as worker 0 on this thread with no
    # parallel region, so no OpenMP state to keep; a plan of more threads runs
    # it through launch_workers, whose own parallel region sets no count, or,
    # through Numba's loop, whose compiled code sets every OpenMP runtime's
    # count back after the launch (cso.macrokernel.workers).  The nest runs
    # `threads` workers of its own (one per part of the workspace), so on
    # Numba's loop its thread count needs raising only when it is lower: by
    # launch_workers itself once the nest's first call has found Numba's C
    # getter and setter or the team (ParallelNest.counted), else from here.
    if plan.threads == 1 or launch.loop_nest.counted or numba_thread_count() >= plan.threads:
        launch.loop_nest(*arguments)
        return
    with numba_threads(plan.threads):
        launch.loop_nest(*arguments)


_thread_count_function = []  # [the function numba_thread_count calls], once found


def numba_thread_count() -> int:
    """``numba.get_num_threads()``, the calling thread's count, without its
    lock and checks on every call after the first: Numba's C getter behind
    it where this Numba keeps one (``numba.np.ufunc.parallel``, 0.59 on)
    and it agrees with the public function, else the public function: 0.11
    against 0.65 microseconds a call on a Xeon, where a two-thread call of a
    tiny layer took 13.6."""
    if not _thread_count_function:
        # The first query starts Numba's thread pool (the getter is set then),
        # which sets the OpenMP thread count: kept as the caller had it.
        with kept_openmp_threads():
            count = numba.get_num_threads()
        getter = getattr(_numba_parallel, "_get_num_threads", None)
        usable = callable(getter) and getter() == count
        _thread_count_function.append(getter if usable else numba.get_num_threads)
        return count
    return _thread_count_function[0]()


def loop_arguments(
    launch: Launch, x, filters: FilterOperands, y: np.ndarray, epilogue: Epilogue = NO_EPILOGUE
) -> tuple:
    """The arguments ``launch.loop_nest`` is called with (see :func:`run`)."""
    if epilogue.residual is None:
        residual, has_residual = placeholder(1, y.dtype), False
    else:
        residual, has_residual = epilogue.residual.reshape(-1), True
    fused = (filters.bias, filters.has_bias, residual, epilogue.activation, has_residual)
    return nest_arguments(
        launch, flat_operand(x, y.dtype), filters_read(launch, filters), fused, y
    )


def filters_read(launch: Launch, filters: FilterOperands) -> tuple:
    """The filter operands ``launch``'s nest takes: the tap, lane, plane and
    row nests read no edge filters."""
    return (filters.array,) if launch.offsets is not None else (filters.array, filters.edge)


def nest_arguments(launch: Launch, x_flat, filters: tuple, fused: tuple, y: np.ndarray) -> tuple:
    """Every loop nest's arguments, in order: the flat input, ``filters``
    (:func:`filters_read`), ``fused`` (bias, has_bias, residual, activation
    code, has_residual), the flat output, the calling thread's workspace
    (or the launch's constant one), then the tap offsets (the depthwise
    families) and the bounds."""
    last = (launch.bounds,) if launch.offsets is None else (launch.offsets, launch.bounds)
    return (x_flat,) + filters + fused + (y.ravel(), nest_workspace(launch, y.dtype)) + last


def nest_workspace(launch: Launch, dtype) -> np.ndarray:
    """The workspace ``launch``'s nest takes: its constant one (a nest that
    writes no scratch, :class:`~cso.launch.Launch`), else the calling
    thread's kept buffer (:mod:`cso.workspace`)."""
    if launch.constant_workspace is not None:
        return launch.constant_workspace
    return workspace(launch.workspace_elements, dtype)


class numba_threads:
    """Run the enclosed parallel Numba code on ``threads`` workers, and leave
    the process's OpenMP thread count as it was (:mod:`cso.openmp`).

    ``set_num_threads`` is per calling thread in Numba, so concurrent callers
    with different counts do not disturb each other.  A class rather than a
    generator-based context manager: it is entered on every call, and this
    costs a third as much.
    """

    __slots__ = ("threads", "previous", "kept")

    def __init__(self, threads: int):
        self.threads = threads

    def __enter__(self):
        # Kept first: Numba's first get_num_threads starts its thread pool,
        # which sets the OpenMP thread count too.
        self.kept = kept_openmp_threads()
        self.kept.__enter__()
        self.previous = numba_thread_count()
        if self.previous != self.threads:
            numba.set_num_threads(self.threads)

    def __exit__(self, *exception):
        if self.previous != self.threads:
            numba.set_num_threads(self.previous)
        self.kept.__exit__(*exception)
        return False


def flat_operand(array, dtype) -> np.ndarray:
    """``array`` as a writeable, C-contiguous 1-D array of ``dtype``: a view
    when it is one already (the common case, checked first: a fraction of a
    microsecond a call less), else a copy."""
    if (
        type(array) is np.ndarray
        and array.dtype == dtype
        and array.flags.c_contiguous
        and array.flags.writeable
    ):
        return array.ravel()
    return writeable(np.ascontiguousarray(array, dtype=dtype)).reshape(-1)


def writeable(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy when it is read-only.

    The loop nests pick between these and their own buffers at run time,
    which Numba allows only between arrays of one type (writeable included).
    """
    return array if array.flags.writeable else array.copy()
