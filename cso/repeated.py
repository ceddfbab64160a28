"""A problem's repeated calls: what depends only on its plan, worked out once.

A model runs each layer's convolution once per inference, on the same
shapes every time, so :func:`cso.conv2d` keeps, for each problem it has
validated (:mod:`cso.conv`), a :class:`RepeatedCall` once it has a plan:
the loop nest's launch, the output's shape and dtype, and the loop nest's
arguments that do not depend on the operands.  A repeated call without
``out``, ``residual``, ``plan`` or ``tuned`` goes straight from the checks
to here.  Every Python step costs more right after a parallel loop nest
than alone (the nest leaves the core's caches to other code): on a Xeon at
two threads, ``dw 3x3 1152 @7``, a 12.6 microsecond loop nest, took 21.2
microseconds a call through the general path and ... through this one.
"""

from __future__ import annotations

import numpy as np

from . import executor
from .analysis.choices import KCRS_ALGORITHMS
from .analysis.plan import Plan
from .launch import launch_for
from .packing.filters import aligned_empty


class RepeatedCall:
    """``plan`` run into a new output, fusing ``activation`` (a code of
    :func:`~cso.analysis.choices.activation_code`)."""

    __slots__ = ("plan", "launch", "dtype", "size", "shape", "epilogue", "kcrs", "edge", "fused")

    def __init__(self, plan: Plan, activation: int):
        self.plan = plan
        self.launch = launch_for(plan, executor.packs_panels_up_front(plan))
        self.dtype = np.dtype(plan.dtype)
        self.shape = plan.geometry.output_shape
        self.size = int(np.prod(self.shape))
        self.epilogue = executor.Epilogue(activation) if activation else executor.NO_EPILOGUE
        # Filters read in place whose operands (bar the filters themselves)
        # are the plan's alone: the depthwise families' KCRS rows, and dense
        # plans reading KCRS with no edge tile to pack (edge not None).
        self.kcrs = plan.algorithm in KCRS_ALGORITHMS
        if self.kcrs:
            self.edge, zero_bias = None, executor.placeholder(1, self.dtype)
        elif executor.packs_panels_up_front(plan):
            self.edge, zero_bias = None, None
        else:
            zero_bias, self.edge = executor.plan_constants(plan)
        placeholder = executor.placeholder(1, self.dtype)
        # The fused operands of a call without a bias (see executor.nest_arguments).
        self.fused = (zero_bias, False, placeholder, activation, False)

    def __call__(self, x: np.ndarray, w: np.ndarray, bias) -> np.ndarray:
        """The convolution of ``x`` by ``w`` plus ``bias`` (None or a ``(K,)``
        array), checked by the caller to be this plan's problem."""
        dtype = self.dtype
        # 64-byte aligned as cso.outputs.new_output makes it, without its reshape.
        y = aligned_empty(self.size, dtype)
        if self.kcrs or (self.edge is not None and bias is None):
            filters = (executor.flat_operand(w, dtype),)
            if not self.kcrs:
                filters += (self.edge,)
            fused = self.fused
            if bias is not None:
                fused = (executor.flat_operand(bias, dtype), True) + fused[2:]
            arguments = executor.nest_arguments(
                self.launch, executor.flat_operand(x, dtype), filters, fused, y
            )
        else:
            operands = executor.filter_operands(w, bias, self.plan)
            arguments = executor.loop_arguments(self.launch, x, operands, y, self.epilogue)
        executor.launch_nest(self.plan, self.launch, arguments)
        return y.reshape(self.shape)
