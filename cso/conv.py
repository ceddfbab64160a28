"""The public call: validate, plan, run."""

from __future__ import annotations

import weakref

import numpy as np

from . import executor
from .analysis.choices import KCRS_ALGORITHMS, activation_code
from .analysis.detect import detect_hardware
from .analysis.plan import check_plan, dtype_name
from .analysis.planner import plan_for_geometry
from .checks import as_array, check_bias, check_ndim, check_out, check_residual, check_threads
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
                return quick(x, w, bias)
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
            return _conv2d_packed(
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
    epilogue = _epilogue(call.activation, residual, y)
    return executor.run(plan, x, executor.filter_operands(w, bias, plan), y, epilogue=epilogue)


def _epilogue(activation: int, residual, y) -> executor.Epilogue:
    """The epilogue for output ``y``: the residual in ``y``'s dtype and layout,
    copied when it shares memory with ``y`` (the loop nests write partial
    sums into ``y`` before they read the residual)."""
    if residual is None:
        return executor.Epilogue(activation) if activation else executor.NO_EPILOGUE
    if np.shares_memory(residual, y):
        residual = residual.astype(y.dtype, order="C", copy=True)
    else:
        residual = executor.writeable(np.ascontiguousarray(residual, dtype=y.dtype))
    return executor.Epilogue(activation, residual)


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
    if not _plain_parameters(parameters):
        return None
    return (x.shape, x.dtype, w.shape, w.dtype, bias_key, parameters)


def _plain_parameters(parameters) -> bool:
    """Whether every one of ``parameters`` is a plain ``int``, ``str`` or
    ``None``, or a (nested) tuple of ints: parameters that may key a cache of
    checked calls (see :func:`_call_key`)."""
    for value in parameters:
        kind = type(value)
        # The common scalars inline: a call to _plain each cost a small call 0.1 us.
        if not (kind is int or value is None or kind is str or _plain(value)):
            return False
    return True


def _plain(value, depth=0) -> bool:
    kind = type(value)
    if kind is int or kind is str or value is None:
        return True
    return kind is tuple and depth < 2 and all(_plain(item, depth + 1) for item in value)


_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _conv2d_packed(
    x, packed, bias, stride, padding, dilation, groups, out, threads, plan, activation, residual
):
    """``conv2d`` with pre-packed filters: their plan, panels and bias."""
    # The geometry as the call gives it: part of the key, so that a call that
    # repeats the packed filters' own stride, padding, dilation and groups
    # (checked once below) is met again as one that leaves them out is.
    given_key = (stride, padding, dilation, groups)
    if not _plain_parameters(given_key):
        given_key = None
    if (
        type(x) is np.ndarray
        and bias is None
        and plan is None
        and given_key is not None
        and (threads is None or type(threads) is int)
    ):
        entry = _packed_calls.get((id(packed), x.shape, x.dtype, threads, given_key))
        if entry is not None and entry[0]() is packed:
            # A call met before: its checks passed and its plan is made.
            repeated = entry[1]
            if out is None:
                quick = entry[3]
                if quick and residual is None and entry[2] == activation:
                    return quick(x, packed.panels, packed.bias)
                residual = check_residual(residual, repeated.shape)
                code = activation_code(activation)
                y = repeated(x, packed.panels, packed.bias, code, residual)
                if quick is None and residual is None:
                    # The quick call for this activation (False where there is none).
                    quick = repeated.quick_call(code, x, packed.panels, packed.bias)
                    entry[2], entry[3] = activation, quick or False
                return y
            residual, y = _packed_output(x, packed, repeated.shape, out, residual)
            return _run_packed(
                repeated.plan, x, packed, y, activation_code(activation), residual
            )
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
    x = as_array(x, "x")
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
    threads_given = threads
    threads = check_threads(threads, executor.available_threads())
    activation = activation_code(activation)
    geometry = make_geometry(x.shape, packed.w_shape, **params)
    residual, y = _packed_output(x, packed, geometry.output_shape, out, residual)
    if geometry.batch == 0:
        return y
    plan = packed.plan
    if plan.geometry != geometry or plan.threads != threads:
        # Another batch size or thread count: the same panels, with the plan
        # made again for this call.  Dense panels depend on Nf only (the cache
        # tiling is replanned for that kernel); depthwise ones are the KCRS
        # rows, which any segment reads.
        depthwise = plan.algorithm in KCRS_ALGORITHMS
        plan = plan_for_geometry(
            geometry,
            dtype.name,
            plan.hardware,
            None if depthwise else plan.filters_per_tile,
            None if depthwise else plan.windows_per_tile,
            None,
            threads,
            vector_operand=None if depthwise else plan.vector_operand,
            filters_prepacked=True,
            algorithm=plan.algorithm,
        )
    if (threads_given is None or type(threads_given) is int) and given_key is not None:
        if len(_packed_calls) >= 1024:
            _packed_calls.clear()  # bounds a process that meets many shapes
        key = (id(packed), x.shape, x.dtype, threads_given, given_key)
        _packed_calls[key] = [weakref.ref(packed), RepeatedCall(plan, prepacked=True), None, None]
    return _run_packed(plan, x, packed, y, activation, residual)


def _packed_output(x, packed, output_shape, out, residual):
    """``(residual, y)``: the residual checked, and ``out`` checked or a new output."""
    residual = check_residual(residual, output_shape)
    check_out(out, output_shape, packed.dtype, (x, packed.panels, packed.bias))
    y = new_output(output_shape, packed.dtype) if out is None else out
    return residual, y


def _run_packed(plan, x, packed, y, activation: int, residual):
    """Run ``plan`` on the packed filters, with the epilogue, into ``y``."""
    operands = executor.prepacked_operands(packed.panels, packed.bias, plan)
    return executor.run(plan, x, operands, y, epilogue=_epilogue(activation, residual, y))


# Calls with packed filters already checked and planned, as [the packed filters
# held weakly, their RepeatedCall, the activation its quick call applies, that
# quick call (RepeatedCall.quick_call; None until made, False where there is
# none)], by (id of the packed
# filters, x's shape and dtype, threads, the stride, padding, dilation and
# groups as given): a repeated call (every layer of a session) skips the checks
# and the replanning.  Calls that repeated the filters' own padding took the
# checked path every time, a RepeatedCall made anew each call: 1.075x the
# time of the loop nest alone on ResNet-50's conv1 and `3x3 64 @56` (AMD
# EPYC, Zen 3).  The filters are held weakly,
# so that the cache keeps no panels alive (an id reused by new filters fails
# the identity check).  A tiny 1x1 layer took 33
# microseconds a call with packed filters, 19 without, before this.
_packed_calls: dict = {}
