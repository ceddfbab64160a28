"""The public call: validate, plan, run."""

from __future__ import annotations

import numpy as np

from . import executor
from .analysis.choices import activation_code
from .analysis.detect import detect_hardware
from .analysis.plan import check_plan, dtype_name
from .analysis.planner import plan_for_geometry
from .checks import (
    as_array, check_bias, check_ndim, check_out, check_residual, check_threads,
    plain_parameters,
)  # fmt: skip
from .conv_packed import conv2d_packed
from .geometry import make_geometry, result_dtype
from .packed import PackedFilters
from .repeated import RepeatedCall
from .tuned_store import check_tuned, tuned_plan
from .outputs import new_output



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
    activation=None,
    residual=None,
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
        Worker threads (default: all of Numba's pool, one per core).  With
        ``plan``, None or the plan's own ``threads``.
    plan : Plan, optional
        A plan from :func:`cso.plan_conv2d` for exactly this problem, used
        instead of the analysis' choice; it runs on its own ``threads``.
    tuned : bool or path-like
        Use the plan :func:`cso.tune` stored for this problem, machine and
        cso version, if there is one (True: the default store, or a path to
        another); otherwise the analysis' plan.  A damaged store is ignored
        with a warning.
    activation : str, optional
        Applied to every output: one of ``"relu"``, ``"relu6"``,
        ``"sigmoid"``, ``"silu"``, ``"hardswish"``, ``"hardsigmoid"``,
        ``"gelu"`` (as PyTorch defines them), or None.
    residual : array_like, shape (N, K, P, Q), optional
        Added to the output before the activation:
        ``y = activation(conv(x, w) + bias + residual)``, in the result
        dtype.  It may be ``out`` itself (read before it is overwritten).

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

    The bias, residual and activation are fused: the micro-kernels apply
    them to each output tile in registers when its last channel tile is
    written, so they cost no pass over the output.
    """
    # A repeated call with arrays as given, plain parameters and none of
    # out, plan, tuned or residual goes from one lookup of its validated
    # problem (under _call_key's key) straight to its RepeatedCall, in line:
    # every Python step of the general path below costs several times more
    # when a loop nest or other work has just left the caches cold.
    if (
        type(x) is np.ndarray
        and type(w) is np.ndarray
        and out is None
        and plan is None
        and tuned is False
        and residual is None
        and (bias is None or type(bias) is np.ndarray)
        and type(stride) is int
        and type(padding) is int
        and type(dilation) is int
        and type(groups) is int
        and (threads is None or type(threads) is int)
        and (activation is None or type(activation) is str)
    ):
        call = _validated.get(
            (
                x.shape, x.dtype, w.shape, w.dtype,
                None if bias is None else (bias.shape, bias.dtype),
                (stride, padding, dilation, groups, threads, activation),
            )
        )  # fmt: skip
        if call is not None:
            quick = call.quick
            if quick:
                try:
                    return quick(x, w, bias)
                except TypeError:
                    pass  # raised before any work: operands to convert, below
            repeated = call.repeated
            if repeated is not None:
                y = repeated(x, w, bias, call.activation, None)
                if quick is None:
                    # Its first call has found the nest's address: the quick
                    # call can be made now (once: False where there is none).
                    call.quick = repeated.quick_call(call.activation, x, w, bias) or False
                return y
    if tuned is not False:
        check_tuned(tuned)
    # Arrays as given skip as_array here: their dtypes are in the key, and a
    # key is only ever stored after _validate has checked them.
    if type(x) is not np.ndarray or type(w) is not np.ndarray:
        if isinstance(w, PackedFilters):
            if tuned:
                raise ValueError(
                    "tuned must be False with packed filters: they carry their own plan"
                )
            return conv2d_packed(
                x, w, bias, stride, padding, dilation, groups, out, threads, plan, activation,
                residual,
            )  # fmt: skip
        x = as_array(x, "x")
        w = as_array(w, "w")
    key = _call_key(x, w, bias, (stride, padding, dilation, groups, threads, activation))
    call = _validated.get(key) if key is not None else None
    if call is None:
        call, bias = _validate(x, w, bias, stride, padding, dilation, groups, threads, activation)
        if key is not None:
            if len(_validated) >= 1024:
                _validated.clear()  # bounds a process that calls many shapes
            _validated[key] = call
    # On a hit, bias is None or an ndarray of a dtype and shape checked before.
    repeated = call.repeated
    if repeated is not None and out is None and plan is None and not tuned:
        if residual is not None:
            residual = check_residual(residual, call.output_shape)
        return repeated(x, w, bias, call.activation, residual)
    geometry, dtype, output_shape = call.geometry, call.dtype, call.output_shape
    residual = check_residual(residual, output_shape)
    check_out(out, output_shape, dtype, (x, w, bias))
    if plan is not None:
        check_plan(plan, geometry, dtype)
        _check_plan_threads(plan, threads)
    y = new_output(output_shape, dtype) if out is None else out
    if geometry.batch == 0:
        return y
    if plan is None and tuned:
        plan = tuned_plan(geometry, dtype.name, call.threads, tuned)
    if plan is None:
        if call.repeated is None:
            # detect_hardware() is fixed once it has succeeded: so is this plan.
            call.repeated = RepeatedCall(
                plan_for_geometry(
                    geometry, dtype_name(dtype), detect_hardware(), None, None, None,
                    call.threads,
                )
            )  # fmt: skip
        plan = call.repeated.plan
    epilogue = executor.epilogue_for(call.activation, residual, y)
    return executor.run(plan, x, executor.filter_operands(w, bias, plan), y, epilogue=epilogue)

class _Call:
    """What validating a call's shapes, dtypes and parameters found, and the
    analysis' plan for it once needed, prepared for the calls that repeat it
    (``repeated``: a :class:`~cso.repeated.RepeatedCall`, holding the plan)."""

    __slots__ = (
        "geometry", "output_shape", "dtype", "threads", "activation", "repeated", "quick"
    )  # fmt: skip

    def __init__(self, geometry, dtype, threads, activation):
        self.geometry, self.dtype, self.threads = geometry, dtype, threads
        # Kept: the geometry computes it anew each time (a microsecond a call).
        self.output_shape = geometry.output_shape
        self.activation, self.repeated = activation, None
        # RepeatedCall.quick_call's call for this key's operands, False where
        # there is none, None until the repeated call has been made once.
        self.quick = None


# Validated calls by _call_key: a repeated call skips the checks, the
# geometry and the planner's memo (a tiny call 17.0 -> 13.2 microseconds,
# experiments/call_overhead.py).
_validated: dict = {}


def _validate(x, w, bias, stride, padding, dilation, groups, threads, activation):
    """Every check of ``conv2d``'s operands and parameters, in order (the
    first failure raises): ``(_Call, bias as an array or None)``."""
    x, w = as_array(x, "x"), as_array(w, "w")  # arrays of a dtype not checked yet
    check_ndim(x, "x", "(N, C, H, W)")
    check_ndim(w, "w", "(K, C // groups, R, S)")
    geometry = make_geometry(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    dtype = result_dtype(x.dtype, w.dtype)
    bias = check_bias(bias, geometry.filters)
    threads = check_threads(threads, executor.available_threads())
    return _Call(geometry, dtype, threads, activation_code(activation)), bias


def _check_plan_threads(plan, threads) -> None:
    """A given plan runs on its own thread count: ``threads`` must be None or it."""
    if threads is not None and threads != plan.threads:
        raise ValueError(
            f"threads must be None or the plan's own ({plan.threads}) with plan=..., "
            f"got {threads!r}: make the plan with threads={threads!r}"
        )
    check_threads(plan.threads, executor.available_threads())


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
    if not plain_parameters(parameters):
        return None
    return (x.shape, x.dtype, w.shape, w.dtype, bias_key, parameters)
