"""``cso.conv2d`` with filters packed ahead of time (:func:`cso.pack_filters`).

:func:`cso.conv2d` hands a call whose ``w`` is a
:class:`~cso.packed.PackedFilters` to :func:`conv2d_packed`: the packed
filters carry their plan (made again for another batch size or thread
count), so the call checks ``x`` and the parameters against them, and a
call met before (:data:`_packed_calls`) goes straight to its
:class:`~cso.repeated.RepeatedCall`'s quick call.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import executor
from .analysis.choices import KCRS_ALGORITHMS, Algorithm, activation_code
from .analysis.winograd import plan_winograd
from .analysis.planner import plan_for_geometry
from .checks import as_array, check_out, check_residual, check_threads, plain_parameters
from .geometry import make_geometry
from .outputs import new_output
from .repeated import RepeatedCall

_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def conv2d_packed(
    x, packed, bias, stride, padding, dilation, groups, out, threads, plan, activation, residual
):
    """:func:`cso.conv2d` with pre-packed filters: their plan, panels and
    bias (the parameters as ``conv2d`` takes them, ``packed`` its ``w``)."""
    # The geometry as the call gives it: part of the key, so that a call that
    # repeats the packed filters' own stride, padding, dilation and groups
    # (checked once below) is met again as one that leaves them out is.
    given_key = (stride, padding, dilation, groups)
    if not plain_parameters(given_key):
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
                    try:
                        return quick(x, packed.panels, packed.bias)
                    except TypeError:
                        pass  # raised before any work: an input to convert, below
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
        # rows, which any segment reads; Winograd's transformed filters are
        # laid out for their kernel's Nf, which the new plan keeps.
        depthwise = plan.algorithm in KCRS_ALGORITHMS
        if plan.algorithm == Algorithm.WINOGRAD:
            shape = (plan.filters_per_tile, plan.windows_per_tile)
            plan = plan_winograd(geometry, dtype.name, plan.hardware, threads, True, shape)
        else:
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
    epilogue = executor.epilogue_for(activation, residual, y)
    return executor.run(plan, x, operands, y, epilogue=epilogue)


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
