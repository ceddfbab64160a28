"""The public call: validate, plan, run."""

from __future__ import annotations

import numba
import numpy as np

from .analysis.hardware import Hardware
from .analysis.plan import Plan, plan_for_geometry
from .geometry import make_geometry, result_dtype
from .macrokernel.bounds import LoopBounds
from .microkernels.registry import loop_module
from .packing.filters import pack_bias, pack_edge_filters


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
    x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out=None, threads=None, plan=None
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

    Returns
    -------
    numpy.ndarray
        ``(N, K, P, Q)`` of dtype ``np.result_type(x, w, np.float32)``
        (float32 or float64), computed natively in that precision.

    Raises
    ------
    TypeError, ValueError
        Before any work, naming the parameter and what was expected.
    """
    x = _as_array(x, "x")
    w = _as_array(w, "w")
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
    threads = _check_threads(threads)
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
        if out.shape != geometry.output_shape or out.dtype != dtype:
            raise ValueError(
                f"out must have shape {geometry.output_shape} and dtype {dtype}, "
                f"got {out.shape} and {out.dtype}"
            )
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")
        if any(a is not None and np.shares_memory(out, a) for a in (x, w, bias)):
            raise ValueError("out must not overlap x, w or bias")
    if plan is not None:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a cso.Plan, got {type(plan).__name__}")
        if not plan.matches(geometry, dtype):
            raise ValueError(
                "plan was made for another problem: expected a plan for "
                f"{geometry} in {dtype.name}, got one for {plan.geometry} "
                f"in {plan.dtype}"
            )
    y = np.empty(geometry.output_shape, dtype=dtype) if out is None else out
    if geometry.batch == 0:
        return y
    if plan is None:
        plan = plan_for_geometry(geometry, dtype.name, Hardware.detect(), None, None, None, threads)
    return _run(x, w, bias, y, plan, threads)


def _run(x, w, bias, y, plan: Plan, threads: int) -> np.ndarray:
    """Pack the edge filter tiles, then drive the plan's loop nest; ``y`` is overwritten."""
    g = plan.geometry
    x_ready = np.ascontiguousarray(x, dtype=y.dtype)
    pointwise = g.kernel_height == g.kernel_width == 1
    unpadded = g.pad_top == g.pad_bottom == g.pad_left == g.pad_right == 0
    subsample = pointwise and unpadded and (g.stride_h, g.stride_w) != (1, 1)
    if subsample:
        # A strided, unpadded 1x1 convolution reads only every stride-th pixel:
        # keep just those (a small strided copy), and it becomes a stride-1 1x1
        # convolution whose input is read in place, with no packing.
        x_ready = np.ascontiguousarray(
            x_ready[
                :,
                :,
                : g.stride_h * (g.out_height - 1) + 1 : g.stride_h,
                : g.stride_w * (g.out_width - 1) + 1 : g.stride_w,
            ]
        )
    x_flat = _writeable(x_ready).reshape(-1)
    # Full filter tiles are read in place from KCRS; only the last, partial
    # tile of each group is packed (zero rows past K), a few kilobytes.
    w_flat = _writeable(np.ascontiguousarray(w, dtype=y.dtype)).reshape(-1)
    edge_filters = pack_edge_filters(
        w_flat, g.groups, g.filters_per_group, g.reduction_length, plan.filters_per_tile
    )
    packed_bias = pack_bias(bias, g.filters, g.groups, plan.filters_per_tile, y.dtype)
    bounds = LoopBounds(
        batch=g.batch,
        groups=g.groups,
        channels=g.channels_per_group,
        filters=g.filters_per_group,
        kernel_height=g.kernel_height,
        kernel_width=g.kernel_width,
        stride_h=1 if subsample else g.stride_h,
        stride_w=1 if subsample else g.stride_w,
        dilation_h=g.dilation_h,
        dilation_w=g.dilation_w,
        height=x_ready.shape[2],
        width=x_ready.shape[3],
        pad_top=g.pad_top,
        pad_left=g.pad_left,
        out_height=g.out_height,
        out_width=g.out_width,
        channel_tile=plan.channel_tile,
        l2_tiles=plan.l2_tiles,
        l3_tiles=plan.l3_tiles,
        filters_per_tile=plan.filters_per_tile,
        windows_per_tile=plan.windows_per_tile,
        input_in_place=pointwise and unpadded and x_ready.shape[2:] == (g.out_height, g.out_width),
        filters_packed=False,
    )
    module = loop_module(
        plan.filters_per_tile, plan.windows_per_tile, plan.dtype, plan.vector_lanes
    )
    loop_nest = (
        module.convolve_input_stationary
        if plan.schedule == "IS"
        else module.convolve_weight_stationary
    )
    # set_num_threads is per calling thread in Numba, so concurrent callers
    # with different counts do not disturb each other.
    previous = numba.get_num_threads()
    if previous != threads:
        numba.set_num_threads(threads)
    try:
        loop_nest(
            x_flat, w_flat, edge_filters, packed_bias, bias is not None, y.reshape(-1), bounds
        )
    finally:
        if previous != threads:
            numba.set_num_threads(previous)
    return y


def _writeable(array: np.ndarray) -> np.ndarray:
    # The loop nests pick between these and their own buffers at run time,
    # which Numba allows only between arrays of one type (writeable included).
    return array if array.flags.writeable else array.copy()
