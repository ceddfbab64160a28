"""A parallel region opened straight through the OpenMP runtime.

:func:`run_team` calls the runtime's ``GOMP_parallel`` (GNU OpenMP's entry
point for ``#pragma omp parallel``, which Intel's and LLVM's runtimes also
export) with a function generated beside it, which calls the nest at
``address`` as each worker its thread takes, with the arguments the caller
stored in a struct on its stack.  That is all a launch needs; Numba's
parallel loop (:func:`cso.macrokernel.workers.run_workers`) takes more steps
around the same region: the schedule computed and allocated, the
arguments packed into a ufunc's arrays, a ``getppid`` system call, the
loop's own barrier, and the thread counts set and kept around it.  On a
Xeon (Sapphire Rapids), two threads, EfficientNet-B0's 16 depthwise calls'
loop nests timed in the benchmark's rounds (interleaved with im2col and
torch): 653 microseconds through this against 713 through Numba's loop
(best rounds; medians 10 microseconds a call less).

Contract: the struct is ``{nest address, workers, omp_get_thread_num,
omp_get_num_threads, a0, ..., a10}``, each argument in its
:func:`~cso.macrokernel.calling.canonical_type`'s representation; thread
``t`` of a team of ``n`` runs workers ``t, t + n, ...`` below ``workers``
(a runtime may give a region fewer threads than asked: nested, or under
``OMP_THREAD_LIMIT``), each as ``nest(worker, a0, ..., a10)`` in Numba's
calling convention.  The ``num_threads`` given to ``GOMP_parallel`` does
not change the caller's OpenMP thread count (a clause, not a setting).
"""

from __future__ import annotations

import hashlib

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .calling import nest_types, nest_values

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_BYTES = ir.IntType(8).as_pointer()
_BODY = ir.FunctionType(ir.VoidType(), [_BYTES])
# void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)
_PARALLEL = ir.FunctionType(ir.VoidType(), [_BODY.as_pointer(), _BYTES, _I32, _I32])
_QUERY = ir.FunctionType(_I32, [])
_HEAD = 4  # nest address, workers, omp_get_thread_num, omp_get_num_threads


def _team_body(context, module, struct, target):
    """The function each thread of the team runs (one per argument types
    in a module): its workers of the nest, the arguments read from the
    struct the caller passes."""
    name = "cso_team_" + hashlib.sha1(str(target).encode()).hexdigest()[:16]
    body = module.globals.get(name)
    if body is not None:
        return body
    body = ir.Function(module, _BODY, name=name)
    body.linkage = "internal"
    builder = ir.IRBuilder(body.append_basic_block("entry"))
    data = builder.bitcast(body.args[0], struct.as_pointer())
    fields = [
        builder.load(builder.gep(data, [_I32(0), _I32(index)]))
        for index in range(len(struct.elements))
    ]
    nest_address, workers, thread_number, team_size = fields[:_HEAD]

    def query(address):
        return builder.sext(builder.call(builder.inttoptr(address, _QUERY.as_pointer()), []), _I64)

    thread, team = query(thread_number), query(team_size)
    nest_type = context.call_conv.get_function_type(types.none, target)
    nest = builder.inttoptr(nest_address, nest_type.as_pointer())
    worker = cgutils.alloca_once_value(builder, thread)
    loop = body.append_basic_block("workers")
    done = body.append_basic_block("done")
    builder.cbranch(builder.icmp_signed("<", thread, workers), loop, done)
    builder.position_at_end(loop)
    index = builder.load(worker)
    # The nests raise nothing: their status is not read.
    context.call_conv.call_function(builder, nest, types.none, target, [index] + fields[_HEAD:])
    following = builder.add(index, team)
    builder.store(following, worker)
    builder.cbranch(builder.icmp_signed("<", following, workers), loop, done)
    builder.position_at_end(done)
    builder.ret_void()
    return body


@intrinsic
def run_team(typingctx, parallel, thread_number, team_size, address, workers, a0, a1, a2, a3,
             a4, a5, a6, a7, a8, a9, a10):  # fmt: skip
    """Workers ``0 .. workers-1`` of the nest at ``address`` in one parallel
    region of ``workers`` threads, opened by the ``GOMP_parallel`` at
    ``parallel`` (``thread_number`` and ``team_size``: that runtime's
    ``omp_get_thread_num`` and ``omp_get_num_threads``); the integers of
    any integer type."""
    head_given = (address, workers, thread_number, team_size)
    given = (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
    target = nest_types(given)

    def codegen(context, builder, signature, values):
        struct = ir.LiteralStructType(
            [_I64] * _HEAD + [context.get_value_type(t) for t in target[1:]]
        )
        body = _team_body(context, builder.module, struct, target)
        parallel_value, thread_value, team_value, address_value, workers_value = values[:5]
        head = nest_values(
            context, builder, (address_value, workers_value, thread_value, team_value),
            head_given, (types.int64,) * _HEAD,
        )  # fmt: skip
        slot = cgutils.alloca_once(builder, struct)
        arguments = nest_values(context, builder, values[5:], given, target[1:])
        for index, value in enumerate(head + arguments):
            builder.store(value, builder.gep(slot, [_I32(0), _I32(index)]))
        start = nest_values(context, builder, (parallel_value,), (parallel,), (types.int64,))[0]
        function = builder.inttoptr(start, _PARALLEL.as_pointer())
        count = builder.trunc(head[1], _I32)
        builder.call(function, [body, builder.bitcast(slot, _BYTES), count, _I32(0)])
        return context.get_dummy_value()

    arguments = (parallel, thread_number, team_size, address, workers) + given
    return types.none(*arguments), codegen
