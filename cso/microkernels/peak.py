"""The machine's FMA peak, measured with a register-only LLVM vector loop.

The loop runs ``chains`` independent ``acc = fma(acc, b, c)`` chains of
vectors, enough to cover the FMA latency on every unit, and touches no
memory: the rate it reaches is the arithmetic ceiling any micro-kernel can
approach (as ``shared/tools/peak_flops.c`` does in C).
"""

from __future__ import annotations

import functools
import time

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# Independent FMA chains per loop iteration: enough to cover the FMA latency.
FMA_CHAINS = 12


@functools.lru_cache(maxsize=None)
def fma_loop(dtype_name: str, lanes: int):
    """A jitted ``run(iterations)`` of :data:`FMA_CHAINS` independent vector FMA
    chains of ``lanes`` ``dtype_name`` elements, registers only (memoised)."""
    element = ir.FloatType() if dtype_name == "float32" else ir.DoubleType()
    vector = ir.VectorType(element, lanes)
    suffix = "f32" if dtype_name == "float32" else "f64"
    result_type = types.float32 if dtype_name == "float32" else types.float64

    @intrinsic
    def fma_chains(typingctx, iterations):
        def codegen(context, builder, signature, args):
            (count,) = args
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{lanes}{suffix}"
            )
            intp = count.type
            entry = builder.basic_block
            loop = builder.append_basic_block("peak.loop")
            done = builder.append_basic_block("peak.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            index = builder.phi(intp)
            index.add_incoming(ir.Constant(intp, 0), entry)
            multiplier = ir.Constant(vector, [1.0000001] * lanes)
            addend = ir.Constant(vector, [0.9999999] * lanes)
            chains = []
            for chain in range(FMA_CHAINS):
                phi = builder.phi(vector)
                phi.add_incoming(ir.Constant(vector, [float(chain)] * lanes), entry)
                chains.append(phi)
            updated = [builder.call(fma, [acc, multiplier, addend]) for acc in chains]
            for phi, value in zip(chains, updated):
                phi.add_incoming(value, loop)
            following = builder.add(index, ir.Constant(intp, 1))
            index.add_incoming(following, loop)
            builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
            builder.position_at_end(done)
            # Sum one lane of every chain so that nothing is dead code.
            total = ir.Constant(element, 0.0)
            for value in updated:
                total = builder.fadd(
                    total, builder.extract_element(value, ir.Constant(ir.IntType(32), 0))
                )
            return total

        return result_type(types.intp), codegen

    @numba.njit(nogil=True)
    def run(iterations):
        return fma_chains(iterations)

    return run


def fma_peak_gflops(dtype_name: str = "float32", lanes: int = 16, seconds: float = 0.2) -> float:
    """Best-of-five FMA rate of one core, in GFLOP/s (an FMA counts as 2 FLOP).

    Parameters
    ----------
    dtype_name : {"float32", "float64"}
    lanes : int
        Elements per vector (16 for float32 with AVX-512).
    seconds : float
        Rough duration of each of the five timed runs.
    """
    run = fma_loop(dtype_name, lanes)
    run(1000)
    iterations = 1_000_000
    elapsed = 0.0
    while elapsed < seconds / 4:
        iterations *= 2
        start = time.perf_counter()
        run(iterations)
        elapsed = time.perf_counter() - start
    iterations = int(iterations * seconds / elapsed)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        run(iterations)
        best = min(best, time.perf_counter() - start)
    return iterations * FMA_CHAINS * lanes * 2 / best / 1e9
