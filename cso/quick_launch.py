"""A repeated call of a KCRS plan compiled whole: output, operands, launch.

:meth:`cso.repeated.RepeatedCall.quick_call` hands the depthwise and
grouped families' repeated calls (their filters read as KCRS rows,
:data:`~cso.analysis.choices.KCRS_ALGORITHMS`) one compiled function,
:func:`launch_kcrs`, with everything that does not depend on the operands
bound once: an int64 ``state`` (below), the nest's workspace where it is
constant, its offsets and its bounds.  A call then takes one Numba dispatch
of seven arguments, where the Python closure before it allocated the output,
flattened both operands, looked up the workspace and dispatched fourteen;
and each step costs several times more right after other work than warm.

Layout of ``state`` (int64, one per quick call)::

    [NEST]       the nest's address (compiled for the plan's argument types)
    [WORKERS]    the plan's threads (1: the nest runs on the calling thread)
    [COUNTS]     the address of cso.openmp.launch_addresses()'s array, and
    [COUNTS_SIZE] its length (a parallel launch reads it)
    [ZERO_BIAS]  the address of the plan's one-element bias placeholder
    [NO_RESIDUAL] the address of its one-element residual placeholder
    [ACTIVATION] the fused activation's code
    [ALIGNED]    1: the output 64-byte aligned (as cso.outputs makes it)
    [SIZE]       the output's elements
    [SHAPE:SHAPE+4] the output's shape (N, K, P, Q)

The addresses are of arrays kept for the life of the process: the
placeholders of :func:`cso.workspace.placeholder` and the array of
:func:`cso.openmp.launch_addresses` (a one-thread plan's, which reads none:
a module-level array of :mod:`cso.repeated`).
"""

from __future__ import annotations

import sys

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from .macrokernel.workers import compiled_only_for, launch_any
from .numba_cache import guard_module
from .packing.filters import ALIGN_BYTES, aligned_part

NEST, WORKERS, COUNTS, COUNTS_SIZE, ZERO_BIAS, NO_RESIDUAL = 0, 1, 2, 3, 4, 5
ACTIVATION, ALIGNED, SIZE, SHAPE = 6, 7, 8, 9
STATE_LENGTH = SHAPE + 4


@intrinsic
def pointer_to(typingctx, address, like):
    """``address`` as a pointer to ``like``'s element type."""

    def codegen(context, builder, signature, values):
        return builder.inttoptr(values[0], context.get_value_type(signature.return_type))

    return types.CPointer(like.dtype)(types.int64, like), codegen


@njit(nogil=True, cache=True)
def launch_kcrs(state, work, offsets, bounds, x, w, bias):
    """The plan's loop nest on ``x`` and ``w`` (and ``bias``, or None) into a
    new output, returned shaped ``(N, K, P, Q)``; ``work``, ``offsets`` and
    ``bounds`` the nest's (:func:`cso.executor.nest_arguments`)."""
    size = state[SIZE]
    if state[ALIGNED]:
        # On a cache line, as cso.packing.filters.aligned_empty makes it.
        y = aligned_part(np.empty(size + ALIGN_BYTES // x.itemsize, x.dtype), size)
    else:
        y = np.empty(size, x.dtype)
    zero_bias = carray(pointer_to(state[ZERO_BIAS], y), (1,))
    no_residual = carray(pointer_to(state[NO_RESIDUAL], y), (1,))
    counts = carray(pointer_to(state[COUNTS], state), (state[COUNTS_SIZE],))
    x_flat = x.reshape(x.size)
    w_flat = w.reshape(w.size)
    if bias is None:
        terms, has_bias = zero_bias, False
    else:
        terms, has_bias = bias.reshape(bias.size), True
    launch_any(
        state[NEST], state[WORKERS], counts, x_flat, w_flat, terms, has_bias, no_residual,
        state[ACTIVATION], False, y, work, offsets, bounds,
    )  # fmt: skip
    return y.reshape((state[SHAPE], state[SHAPE + 1], state[SHAPE + 2], state[SHAPE + 3]))


def typed_launch_kcrs(arguments: tuple):
    """:func:`launch_kcrs` compiled for the types of ``arguments`` and
    refusing any other (:func:`~cso.macrokernel.workers.compiled_only_for`):
    operands read-only, strided or of another dtype raise ``TypeError``
    before any work, for the caller to take the path that converts them."""
    return compiled_only_for(launch_kcrs, arguments)


def kcrs_state(
    nest_address: int, workers: int, counts: np.ndarray, zero_bias: np.ndarray,
    no_residual: np.ndarray, activation: int, aligned: bool, shape: tuple,
) -> np.ndarray:  # fmt: skip
    """The ``state`` array :func:`launch_kcrs` reads (the module's layout)."""
    state = np.zeros(STATE_LENGTH, np.int64)
    state[NEST], state[WORKERS] = nest_address, workers
    state[COUNTS], state[COUNTS_SIZE] = counts.ctypes.data, counts.size
    state[ZERO_BIAS], state[NO_RESIDUAL] = zero_bias.ctypes.data, no_residual.ctypes.data
    state[ACTIVATION], state[ALIGNED] = activation, int(bool(aligned))
    state[SIZE] = int(np.prod(shape))
    state[SHAPE : SHAPE + 4] = shape
    return state


# Every cached function here compiles for several argument types, in
# whichever processes come first (cso.numba_cache).
guard_module(sys.modules[__name__])
