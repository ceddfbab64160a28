"""How a loop nest is called by address: the types it is compiled for, and
the call itself in Numba's calling convention.

Every family's nest takes the worker's index and eleven arguments
(:func:`cso.executor.nest_arguments`), each array one-dimensional and
C-contiguous, every floating-point array in the first one's dtype (what
:class:`~cso.macrokernel.workers.ParallelNest`'s check of that dtype relies
on).  Both launches call it this way: one worker on the calling thread
(:func:`call_worker`) and each thread of a parallel region
(:mod:`.team`, :mod:`.workers`).
"""

from __future__ import annotations

from numba import types
from numba.core import errors
from numba.extending import intrinsic


def canonical_type(numba_type):
    """The type a nest is compiled for to take an argument of ``numba_type``
    by address: an array without its read-only and alignment flags (they do
    not change its machine representation), any integer as ``int64`` and
    any boolean as ``boolean`` (the calls convert them)."""
    if isinstance(numba_type, types.Array):
        return types.Array(numba_type.dtype, numba_type.ndim, numba_type.layout)
    if isinstance(numba_type, types.Integer):
        return types.int64
    if isinstance(numba_type, types.Boolean):
        # A literal True or False (compiled code's own constants) too: its
        # model differs from a boolean's, which the nests take.
        return types.boolean
    return numba_type


def nest_types(arguments: tuple) -> tuple:
    """The nest's parameter types for ``arguments`` (Numba types, the eleven
    after the worker's index): ``int64`` for the worker, then each one's
    :func:`canonical_type`; a ``TypingError`` for an array the nests do not
    take."""
    first = arguments[0]
    for argument in arguments:
        if not isinstance(argument, types.Array):
            continue
        if argument.ndim != 1 or argument.layout != "C":
            raise errors.TypingError(f"a loop nest takes 1-d C-contiguous arrays, got {argument}")
        if isinstance(argument.dtype, types.Float) and argument.dtype != first.dtype:
            raise errors.TypingError(f"a loop nest's arrays are all {first.dtype}, got {argument}")
    return (types.int64,) + tuple(canonical_type(t) for t in arguments)


def nest_values(context, builder, values, given, target) -> list:
    """``values`` (of Numba types ``given``) as the nest takes them (``target``):
    integers converted, arrays as they are."""
    return [
        value if isinstance(to, types.Array) else context.cast(builder, value, of, to)
        for value, of, to in zip(values, given, target)
    ]


@intrinsic
def call_worker(typingctx, address, worker, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    """Call the nest at ``address`` as ``nest(worker, a0, ..., a10)``
    (Numba's calling convention, the nest compiled for :func:`nest_types`)."""
    given = (worker, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
    target = nest_types(given[1:])

    def codegen(context, builder, signature, values):
        function_type = context.call_conv.get_function_type(types.none, target)
        function = builder.inttoptr(values[0], function_type.as_pointer())
        arguments = nest_values(context, builder, values[1:], given, target)
        # The nests raise nothing: their status is not read.
        context.call_conv.call_function(builder, function, types.none, target, arguments)
        return context.get_dummy_value()

    return types.none(types.intp, types.int64, *given[1:]), codegen
