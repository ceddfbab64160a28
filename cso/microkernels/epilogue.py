"""LLVM IR for the fused epilogue: a residual and an activation applied to
output values while they are still in registers.

What the epilogue computes, for an output value ``v`` that already holds
the convolution and its bias::

    v = act(v + residual)        # the residual only when has_residual

``act`` is chosen at run time by its code (:func:`cso.analysis.choices.activation_code`:
0 for none, then the members of :class:`~cso.analysis.choices.Activation`
in order), so one compiled kernel serves every epilogue: a new kernel
shape costs seconds to compile, and a specialisation per activation and
residual would multiply them by fifteen.  The cost at run time is one
branch on the residual and one switch per output tile.

Contract with the kernels that call :func:`emit_epilogue`: the residual has
the output's layout, so the residual of the value stored at ``out[o]`` is
``residual[o - out_offset + residual_offset]``; the caller gives a loader
for each value and calls it only on the residual branch.

The activations' arithmetic is :mod:`.activations`'s.

:func:`build_epilogue_run` wraps the same arithmetic in a kernel of its own
that applies the epilogue in place to a run of outputs: the loop nests call
it for the outputs they write outside a micro-kernel (edge tiles copied out
of scratch).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..analysis.choices import ACTIVATIONS
from ..packing.run_stores import store_run
from .activations import emit_activation
from .vector_ir import (
    check_float_arrays,
    masked_load_function,
    vector_type,
)


def emit_epilogue(builder, values, residual_of, activation, has_residual):
    """``act(value + residual)`` for each of ``values``, as new IR values.

    Parameters
    ----------
    builder : llvmlite.ir.IRBuilder
    values : list of IR values
        Of one float or float-vector type.
    residual_of : callable
        ``residual_of(index)`` emits the load of ``values[index]``'s residual;
        called only inside the branch taken when ``has_residual``.
    activation : IR integer
        The activation's code (0: none).
    has_residual : IR i1

    Returns
    -------
    list of IR values, in the block where the caller goes on.
    """
    if not values:
        return []
    b = builder
    before = b.basic_block
    add_block = b.append_basic_block("epilogue.residual")
    joined = b.append_basic_block("epilogue.activation")
    b.cbranch(has_residual, add_block, joined)
    b.position_at_end(add_block)
    added = [b.fadd(value, residual_of(index)) for index, value in enumerate(values)]
    add_end = b.basic_block
    b.branch(joined)
    b.position_at_end(joined)
    sums = []
    for value, with_residual in zip(values, added):
        phi = b.phi(value.type)
        phi.add_incoming(value, before)
        phi.add_incoming(with_residual, add_end)
        sums.append(phi)

    switch_block = b.basic_block
    done = b.append_basic_block("epilogue.done")
    switch = b.switch(activation, done)
    results = []
    for code, member in enumerate(ACTIVATIONS, start=1):
        case = b.append_basic_block(f"epilogue.{member.value}")
        switch.add_case(ir.Constant(activation.type, code), case)
        b.position_at_end(case)
        results.append(([emit_activation(b, value, member) for value in sums], b.basic_block))
        b.branch(done)
    b.position_at_end(done)
    finals = []
    for index, value in enumerate(sums):
        phi = b.phi(value.type)
        phi.add_incoming(value, switch_block)
        for activated, block in results:
            phi.add_incoming(activated[index], block)
        finals.append(phi)
    return finals


_NUMBA_FLOAT = {"float32": types.float32, "float64": types.float64}


@functools.lru_cache(maxsize=None)
def build_epilogue_run(dtype_name: str, vector_lanes: int):
    """Return a Numba intrinsic applying the epilogue in place to a run of outputs.

    Callable from ``@njit`` code as ``run(out, out_offset, residual,
    residual_offset, count, activation, has_residual)``:
    ``out[out_offset + j] = act(out[out_offset + j] + residual[residual_offset + j])``
    for ``j < count``, ``vector_lanes`` at a time with masked loads, the
    last, partial vector stored in plain pieces (nothing outside the run is
    read or written).
    """
    if dtype_name not in _NUMBA_FLOAT:
        raise ValueError(f"dtype_name must be float32 or float64, got {dtype_name!r}")
    lanes = int(vector_lanes)

    @intrinsic
    def epilogue_run(
        typingctx, out, out_offset, residual, residual_offset, count, activation, has_residual
    ):
        check_float_arrays(dtype_name, out=out, residual=residual)
        sig = types.void(
            out, types.intp, residual, types.intp, types.intp, types.intp, types.boolean
        )

        def codegen(context, builder, signature, args):
            out_a, out_off, res_a, res_off, count_v, activation_v, has_residual_v = args
            arrays = signature.args
            b = builder
            vector = vector_type(dtype_name, lanes)
            pointer_type = vector.as_pointer()
            i32 = ir.IntType(32)
            load = masked_load_function(b.module, vector)
            element_bytes = 4 if dtype_name == "float32" else 8
            align = ir.Constant(i32, element_bytes)
            zero = ir.Constant(vector, [0.0] * lanes)
            out_base = b.gep(context.make_array(arrays[0])(context, b, out_a).data, [out_off])
            res_base = b.gep(context.make_array(arrays[2])(context, b, res_a).data, [res_off])

            def vector_at(j, mask):
                out_pointer = b.bitcast(b.gep(out_base, [j]), pointer_type)
                value = b.call(load, [out_pointer, align, mask, zero])

                def residual_of(_):
                    pointer = b.bitcast(b.gep(res_base, [j]), pointer_type)
                    return b.call(load, [pointer, align, mask, zero])

                (result,) = emit_epilogue(b, [value], residual_of, activation_v, has_residual_v)
                return result, out_pointer

            # The run's last, partial vector in plain pieces: a masked store
            # is microcoded on AMD.
            store_run(b, count_v, lanes, element_bytes, "epilogue_run", vector_at)
            return context.get_dummy_value()

        return sig, codegen

    return epilogue_run
