"""The public call: validate, plan, run."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from .analysis.hardware import Hardware
from .analysis.plan import Plan, plan_for_geometry
from .geometry import ceil_div, make_geometry, result_dtype
from .macrokernel.bounds import LoopBounds
from .microkernels.registry import loop_module
from .packing.filters import (
    pack_bias,
    pack_edge_filter_rows,
    pack_edge_filters,
    pack_filters_panels,
)
from .workspace import worker_stride, workspace


# dtype.name is slow enough (a microsecond) to show in a small layer's call.
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}


def _as_array(value, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.asarray(value)
        except Exception as error:  # ragged lists and the like
            raise TypeError(f"{name} must be array-like of real numbers: {error}") from None
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must have a real numeric dtype, got {array.dtype}")
    return array


def _check_threads(threads) -> int:
    available = numba.config.NUMBA_NUM_THREADS
    if threads is None:
        return available
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int or None, got {type(threads).__name__}")
    if not 1 <= threads <= available:
        raise ValueError(
            f"threads must be between 1 and {available} (Numba's thread pool), got {threads}"
        )
    return int(threads)


def conv2d(
    x,
    w,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    out=None,
    threads=None,
    plan=None,
    tuned=False,
) -> np.ndarray:
    """2-D convolution (cross-correlation, as in deep-learning frameworks).

    Parameters
    ----------
    x : array_like, shape (N, C, H, W)
        Input.
    w : array_like, shape (K, C // groups, R, S)
        Filters.
    bias : array_like, shape (K,), optional
        Added to every output position of each filter.
    stride, dilation : int or (int, int)
        Step between windows, and between kernel taps.
    padding : int, (int, int), ((int, int), (int, int)), "valid" or "same"
        Zeros around the input: all sides, (height, width), or
        ((top, bottom), (left, right)).  "same" needs stride 1.
    groups : int
        Channel groups; ``C`` and ``K`` must be multiples of it.
    out : numpy.ndarray, optional
        C-contiguous ``(N, K, P, Q)`` array of the result dtype to write into.
    threads : int, optional
        Worker threads (default: all of Numba's pool, one per core).
    plan : Plan, optional
        A plan from :func:`cso.plan_conv2d` for exactly this problem, used
        instead of the analysis' choice.
    tuned : bool or path-like
        Use the plan :func:`cso.tune` stored for this problem, machine and
        cso version, if there is one (True: the default store, or a path to
        another); otherwise the analysis' plan.  A damaged store is ignored
        with a warning.

    Returns
    -------
    numpy.ndarray
        ``(N, K, P, Q)`` of dtype ``np.result_type(x, w, np.float32)``
        (float32 or float64), computed natively in that precision.

    Raises
    ------
    TypeError, ValueError
        Before any work, naming the parameter and what was expected.

    Notes
    -----
    The input panels a call packs go into scratch memory that the calling
    thread keeps for its next calls (:mod:`cso.workspace`); fresh memory
    would fault on every page.  :func:`cso.release_workspace` frees it.
    """
    if isinstance(w, _packed_filters_class()):
        if tuned:
            raise ValueError("tuned must be False with packed filters: they carry their own plan")
        return _conv2d_packed(x, w, bias, stride, padding, dilation, groups, out, threads, plan)
    x = _as_array(x, "x")
    w = _as_array(w, "w")
    key = _call_key(x, w, bias, (stride, padding, dilation, groups, threads))
    call = _validated.get(key) if key is not None else None
    if call is None:
        call, bias = _validate(x, w, bias, stride, padding, dilation, groups, threads)
        if key is not None:
            if len(_validated) >= 1024:
                _validated.clear()  # bounds a process that calls many shapes
            _validated[key] = call
    # On a hit, bias is None or an ndarray of a dtype and shape checked before.
    geometry, dtype, threads = call.geometry, call.dtype, call.threads
    _check_out(out, geometry.output_shape, dtype, (x, w, bias))
    if plan is not None:
        _check_plan(plan, geometry, dtype)
    y = np.empty(geometry.output_shape, dtype=dtype) if out is None else out
    if geometry.batch == 0:
        return y
    if plan is None and tuned:
        from .tune import tuned_plan

        plan = tuned_plan(geometry, dtype.name, threads, tuned)
    if plan is None:
        plan = call.plan
        if plan is None:
            plan = plan_for_geometry(
                geometry, _DTYPE_NAMES[dtype], Hardware.detect(), None, None, None, threads
            )
            # Hardware.detect() is fixed once it has succeeded: so is this plan.
            call.plan = plan
    filters, packed_bias = _prepare_filters(w, bias, plan)
    return _run(x, filters, packed_bias, bias is not None, y, plan, threads)


class _Call:
    """What validating a call's shapes, dtypes and parameters found, and the
    analysis' plan for it once needed."""

    __slots__ = ("geometry", "dtype", "threads", "plan")

    def __init__(self, geometry, dtype, threads):
        self.geometry, self.dtype, self.threads, self.plan = geometry, dtype, threads, None


# Validated calls by _call_key: a repeated call skips the checks, the
# geometry and the planner's memo (a tiny call 17.0 -> 13.2 microseconds,
# experiments/call_overhead.py).
_validated: dict = {}


def _validate(x, w, bias, stride, padding, dilation, groups, threads):
    """Every check of ``conv2d``'s operands and parameters, in order (the
    first failure raises): ``(_Call, bias as an array or None)``."""
    for array, name, letters in ((x, "x", "(N, C, H, W)"), (w, "w", "(K, C // groups, R, S)")):
        if array.ndim != 4:
            raise ValueError(
                f"{name} must be 4-D {letters}, got {array.ndim}-D shape {array.shape}"
            )
    geometry = make_geometry(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    dtype = result_dtype(x.dtype, w.dtype)
    if bias is not None:
        bias = _as_array(bias, "bias")
        if bias.shape != (geometry.filters,):
            raise ValueError(f"bias must have shape ({geometry.filters},) (K), got {bias.shape}")
    return _Call(geometry, dtype, _check_threads(threads)), bias


def _check_plan(plan, geometry, dtype) -> None:
    """Raise unless ``plan`` is a :class:`Plan` made for ``geometry`` in ``dtype``."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a cso.Plan, got {type(plan).__name__}")
    if not plan.matches(geometry, dtype):
        raise ValueError(
            "plan was made for another problem: expected a plan for "
            f"{geometry} in {dtype.name}, got one for {plan.geometry} in {plan.dtype}"
        )


def _call_key(x, w, bias, parameters):
    """A key under which a validated call may be looked up, or None.

    None unless ``bias`` is None or an ndarray and every parameter is a
    plain ``int``, ``str`` or ``None``, or a (nested) tuple of ints: equal
    keys must mean calls that validate alike, and ``True == 1`` or
    ``np.int64(1) == 1`` would make other types collide with ones the
    checks treat differently.
    """
    if bias is None:
        bias_key = None
    elif type(bias) is np.ndarray:
        bias_key = (bias.shape, bias.dtype)
    else:
        return None
    for value in parameters:
        if not _plain(value):
            return None
    return (x.shape, x.dtype, w.shape, w.dtype, bias_key, parameters)


def _plain(value, depth=0) -> bool:
    kind = type(value)
    if kind is int or kind is str or value is None:
        return True
    return kind is tuple and depth < 2 and all(_plain(item, depth + 1) for item in value)


_packed_filters = None


def _packed_filters_class():
    # cso.packed imports this module; an import statement in every call costs a microsecond.
    global _packed_filters
    if _packed_filters is None:
        from .packed import PackedFilters

        _packed_filters = PackedFilters
    return _packed_filters


def _prepare_filters(w, bias, plan: Plan):
    """``((filters, edge_panels, packed), packed_bias)`` for :func:`_run`.

    Window-vectorised and dot-product kernels read the filters in place
    from KCRS, a last, partial tile included (see :func:`_edge_filters`).
    A filter-vectorised kernel loads vectors along the filters, so every
    tile is packed, in the call unless packed ahead of time
    (:func:`cso.pack_filters`).
    """
    g = plan.geometry
    dtype = np.dtype(plan.dtype)
    if plan.vector_operand == "filters":
        with _numba_threads(plan.threads):
            panels = pack_filters_panels(np.asarray(w), g.groups, plan.filters_per_tile, dtype)
        return (panels, panels[: plan.filters_per_tile], True), _bias_panel(bias, plan)
    w_flat = _writeable(np.ascontiguousarray(w, dtype=dtype)).reshape(-1)
    return (w_flat, _edge_filters(w_flat, plan), False), _bias_panel(bias, plan)


def _bias_panel(bias, plan: Plan):
    """``bias`` packed as ``[G][T_f*Nf]``; without one, shared zeros (the
    micro-kernels load the bias row either way, and add it only when there
    is a bias)."""
    g = plan.geometry
    if bias is None:
        padded = ceil_div(g.filters_per_group, plan.filters_per_tile) * plan.filters_per_tile
        return _placeholder(g.groups * padded, plan.dtype)
    return pack_bias(bias, g.filters, g.groups, plan.filters_per_tile, np.dtype(plan.dtype))


def _edge_filters(w_flat, plan: Plan):
    """The packed last filter tile of each group, for filters read in place.

    Only groups of fewer than ``Nf`` filters need it: otherwise the loop
    nests read a last, partial tile as the ``Nf`` KCRS rows that end at
    ``K_g`` and keep its own rows, and this is a placeholder never read.
    """
    g = plan.geometry
    if g.filters_per_group >= plan.filters_per_tile:
        return _placeholder(plan.filters_per_tile, w_flat.dtype)
    pack_edge = pack_edge_filter_rows if plan.vector_operand == "reduction" else pack_edge_filters
    return pack_edge(
        w_flat, g.groups, g.filters_per_group, g.reduction_length, plan.filters_per_tile
    )


_placeholders: dict = {}


def _placeholder(size: int, dtype) -> np.ndarray:
    """A shared array of ``size`` zeros, for an operand the loop nests never
    write and whose values they never use."""
    key = (size, np.dtype(dtype))
    array = _placeholders.get(key)
    if array is None:
        array = _placeholders[key] = np.zeros(size, dtype)
    return array


def _check_out(out, shape, dtype, inputs):
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(
            f"out must have shape {shape} and dtype {dtype}, got {out.shape} and {out.dtype}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writeable")
    if any(a is not None and np.shares_memory(out, a) for a in inputs):
        raise ValueError("out must not overlap x, w or bias")


_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _conv2d_packed(x, packed, bias, stride, padding, dilation, groups, out, threads, plan):
    """``conv2d`` with pre-packed filters: their plan, panels and bias."""
    if bias is not None:
        raise ValueError("bias must be None with packed filters: pass it to cso.pack_filters")
    if plan is not None:
        raise ValueError("plan must be None with packed filters: they carry their own plan")
    given = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    params = packed.conv_params
    for name, value in given.items():
        if value != _DEFAULTS[name]:
            normalised = make_geometry(
                packed.input_shape, packed.w_shape, **dict(params, **{name: value})
            )
            if normalised != packed.plan.geometry:
                raise ValueError(
                    f"{name}={value!r} differs from the packed filters' {name} "
                    f"({params[name]!r}); leave it out or pack again"
                )
    x = _as_array(x, "x")
    expected = ("N",) + tuple(packed.input_shape[1:])
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(packed.input_shape[1:]):
        raise ValueError(
            f"x must have shape {expected} for these packed filters, got {tuple(x.shape)}"
        )
    dtype = packed.dtype
    if np.result_type(x.dtype, dtype) != dtype:
        raise ValueError(
            f"x is {x.dtype} but the filters were packed as {dtype}: "
            f"pack them with dtype={np.result_type(x.dtype, dtype).name}"
        )
    threads = _check_threads(threads)
    geometry = make_geometry(x.shape, packed.w_shape, **params)
    _check_out(out, geometry.output_shape, dtype, (x, packed.panels, packed.bias))
    y = np.empty(geometry.output_shape, dtype=dtype) if out is None else out
    if geometry.batch == 0:
        return y
    plan = packed.plan
    if plan.geometry != geometry or plan.threads != threads:
        # Another batch size or thread count: the same panels (they depend on
        # Nf only), with the cache tiling planned again for this call.
        plan = plan_for_geometry(
            geometry,
            dtype.name,
            plan.hardware,
            plan.filters_per_tile,
            plan.windows_per_tile,
            None,
            threads,
            vector_operand=plan.vector_operand,
            filters_prepacked=True,
        )
    filters, bias_panel, has_bias = _packed_operands(packed, plan)
    return _run(x, filters, bias_panel, has_bias, y, plan, threads)


def _packed_operands(packed, plan: Plan):
    """``(filters, bias_panel, has_bias)`` for :func:`_run` from pre-packed filters.

    Dot-product panels are the KCRS rows, read in place with their last
    partial tile packed as rows; other panels are read whole.
    """
    has_bias = packed.bias is not None
    bias_panel = packed.bias if has_bias else np.zeros(plan.filters_per_tile, packed.dtype)
    if plan.vector_operand == "reduction":
        return (packed.panels, _edge_filters(packed.panels, plan), False), bias_panel, has_bias
    return (packed.panels, packed.panels[: plan.filters_per_tile], True), bias_panel, has_bias


def _run(x, filters, packed_bias, has_bias, y, plan: Plan, threads: int, variant=None):
    """Drive the plan's loop nest; ``y`` is overwritten.

    ``filters`` is ``(array, edge_panels, packed)``: the KCRS filters read in
    place with the packed last tiles, or (``packed``) the full panels.
    """
    filter_array, edge_filters, filters_packed = filters
    launch = _launch(plan, filters_packed, threads, variant)
    x_ready = np.ascontiguousarray(x, dtype=y.dtype)
    arguments = (
        _writeable(x_ready).reshape(-1),
        filter_array,
        edge_filters,
        packed_bias,
        has_bias,
        y.reshape(-1),
        workspace(launch.workspace_elements, y.dtype),
        launch.bounds,
    )
    # The loop nest runs `threads` workers of its own (one per part of the
    # workspace), so Numba's thread count needs changing only when it is lower.
    if numba.get_num_threads() >= threads:
        launch.loop_nest(*arguments)
    else:
        with _numba_threads(threads):
            launch.loop_nest(*arguments)
    return y


class _Launch(NamedTuple):
    """What a plan's loop nest is called with, besides the operands."""

    loop_nest: object
    bounds: LoopBounds
    workspace_elements: int


_launches: dict = {}


def _launch(plan: Plan, filters_packed: bool, threads: int, variant) -> _Launch:
    """The loop nest, its bounds and its workspace size for a plan (memoised).

    Memoised by the plan object's identity (a plan is frozen, and the
    memoised planner hands out the same object for the same problem), so a
    call costs no Python work that only depends on the plan.
    """
    key = (id(plan), filters_packed, threads, variant)
    entry = _launches.get(key)
    if entry is not None and entry[0] is plan:
        return entry[1]
    g = plan.geometry
    # A strided 1x1 convolution's windows are not a contiguous run of x.
    unstrided_pointwise = (g.kernel_height, g.kernel_width, g.stride_h, g.stride_w) == (1, 1, 1, 1)
    unpadded = g.pad_top == g.pad_bottom == g.pad_left == g.pad_right == 0
    # The one window is the whole input: a dot-product plan reads it in place.
    whole_input = g.windows == 1 and (g.kernel_height, g.kernel_width) == (g.height, g.width)
    input_in_place = plan.input_in_place and (unstrided_pointwise or whole_input) and unpadded
    # Packed 1x1 panels are runs of x's rows: copied channel by channel, each
    # row read a run at a time (ResNet-50's such layers 1.02-1.13x faster,
    # python experiments/variants.py --variant tile-by-tile).
    pack_channels_outer = unstrided_pointwise and unpadded and not input_in_place
    panel_elements, scratch_elements = _worker_elements(plan)
    scratch_offset = worker_stride(panel_elements, plan.dtype)
    stride = scratch_offset + worker_stride(scratch_elements, plan.dtype)
    bounds = LoopBounds(
        batch=plan.image_jobs,
        window_images=g.batch if plan.batch_folded else 1,
        groups=g.groups,
        channels=g.channels_per_group,
        filters=g.filters_per_group,
        kernel_height=g.kernel_height,
        kernel_width=g.kernel_width,
        stride_h=g.stride_h,
        stride_w=g.stride_w,
        dilation_h=g.dilation_h,
        dilation_w=g.dilation_w,
        height=g.height,
        width=g.width,
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        out_height=g.out_height,
        out_width=g.out_width,
        channel_tile=plan.channel_tile,
        l2_tiles=plan.l2_tiles,
        l3_tiles=plan.l3_tiles,
        filters_per_tile=plan.filters_per_tile,
        windows_per_tile=plan.windows_per_tile,
        # Only where the layout allows it, whatever a hand-made plan says.
        input_in_place=input_in_place,
        pack_channels_outer=pack_channels_outer,
        filters_packed=filters_packed,
        window_parts=plan.window_parts,
        edge_rows=plan.vector_operand == "reduction",
        workspace_stride=stride,
        scratch_offset=scratch_offset,
    )
    module = loop_module(
        plan.filters_per_tile,
        plan.windows_per_tile,
        plan.dtype,
        plan.vector_lanes,
        variant,
        vector_operand=plan.vector_operand,
    )
    loop_nest = (
        module.convolve_input_stationary
        if plan.schedule == "IS"
        else module.convolve_weight_stationary
    )
    launch = _Launch(loop_nest, bounds, threads * stride)
    if len(_launches) >= 1024:
        _launches.clear()  # plans are few per process; this only bounds a pathological one
    _launches[key] = (plan, launch)
    return launch


def _worker_elements(plan: Plan):
    """``(panels, scratch)``: the elements one worker of the loop nest needs.

    Panels for the input tiles the schedule keeps packed at once (``K3``
    for IS, ``K2`` for WS, never more than there are window tiles), each
    ``Nc*R*S x Nwin``; scratch for one ``Nf x Nwin`` edge tile of output.
    """
    g = plan.geometry
    window_tiles = ceil_div(plan.window_count, plan.windows_per_tile)
    kept = plan.l3_tiles if plan.schedule == "IS" else plan.l2_tiles
    tile = plan.channel_tile * g.kernel_height * g.kernel_width * plan.windows_per_tile
    return min(kept, window_tiles) * tile, plan.filters_per_tile * plan.windows_per_tile


class _numba_threads:
    """Run the enclosed parallel Numba code on ``threads`` workers.

    ``set_num_threads`` is per calling thread in Numba, so concurrent callers
    with different counts do not disturb each other.  A class rather than a
    generator-based context manager: it is entered on every call, and this
    costs a third as much.
    """

    __slots__ = ("threads", "previous")

    def __init__(self, threads: int):
        self.threads = threads

    def __enter__(self):
        self.previous = numba.get_num_threads()
        if self.previous != self.threads:
            numba.set_num_threads(self.threads)

    def __exit__(self, *exception):
        if self.previous != self.threads:
            numba.set_num_threads(self.previous)
        return False


def _writeable(array: np.ndarray) -> np.ndarray:
    # The loop nests pick between these and their own buffers at run time,
    # which Numba allows only between arrays of one type (writeable included).
    return array if array.flags.writeable else array.copy()
