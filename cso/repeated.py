"""A problem's repeated calls: what depends only on its plan, worked out once.

A model runs each layer's convolution once per inference, on the same
shapes every time, so :func:`cso.conv2d` keeps, for each problem it has
validated (:mod:`cso.conv`) and for each packed filters' input shape, a
:class:`RepeatedCall` once it has a plan: the loop nest's launch, the
output's shape and dtype, and the loop nest's arguments that do not depend
on the operands.  A repeated call without ``out``, ``plan`` or ``tuned``
goes straight from the checks to here.  Every Python step
costs more right after a parallel loop nest than alone (the nest leaves
the core's caches to other code): on a Xeon at two threads, ``dw 3x3 1152
@7``, a 12.6 microsecond loop nest, took 21.2 microseconds a call through
the general path and 18.5-19.0 through this one.
"""

from __future__ import annotations

import functools

import numpy as np

from . import executor
from .analysis.choices import KCRS_ALGORITHMS, Algorithm
from .analysis.plan import Plan
from .launch import launch_for
from .macrokernel.workers import launch_workers, nest_address, typed_launch
from .quick_launch import kcrs_state, typed_launch_kcrs
from .packing.filters import aligned_empty
from .workspace import placeholder, workspace


# The families whose outputs are allocated as NumPy does (16-byte aligned):
# the 64-byte alignment aligned_empty gives made no difference to their nests
# in the bench's rounds (a Xeon, EfficientNet-B0's depthwise layers, all of
# these families, into outputs 0, 16 and 32 bytes past a cache line, one and
# two threads: totals within 0.96-1.01x of each other, no layer consistently
# faster aligned), while the aligned allocation cost 3-6 us a call more with
# the caches cold (experiments/call_steps.py).
UNALIGNED_OUTPUT_ALGORITHMS = frozenset(
    (Algorithm.DEPTHWISE_ROWS, Algorithm.DEPTHWISE_PLANES, Algorithm.DEPTHWISE_LANES)
)


# A one-thread launch reads no thread counts (workers.launch_typed).
_NO_COUNTS = np.zeros(2, np.int64)


class RepeatedCall:
    """``plan`` run into a new output.

    Parameters
    ----------
    plan : Plan
    prepacked : bool
        The filters come packed ahead of time (:func:`cso.pack_filters`: its
        panels and packed bias), not as KCRS.
    """

    __slots__ = (
        "plan", "prepacked", "launch", "dtype", "size", "shape", "kcrs", "edge", "zero_bias",
        "no_residual", "tail", "panel_rows", "bias_ready", "threads", "scratch",
        "numpy_output",
    )  # fmt: skip

    def __init__(self, plan: Plan, prepacked: bool = False):
        self.plan, self.prepacked = plan, prepacked
        self.threads = plan.threads
        self.kcrs = plan.algorithm in KCRS_ALGORITHMS
        panels = executor.reads_whole_panels(plan, prepacked)
        self.launch = launch_for(plan, panels)
        self.dtype = np.dtype(plan.dtype)
        self.shape = plan.geometry.output_shape
        self.size = int(np.prod(self.shape))
        # The calls whose filter operands are the filters themselves and the
        # plan's constants (executor.filter_operands, prepacked_operands):
        # the depthwise families' KCRS rows (packed ahead or not: the same);
        # dense plans reading KCRS rows with no edge tile to pack (edge set;
        # packed ahead, dot-product panels are those rows); and panels packed
        # ahead and read whole, whose edge operand is their first Nf rows
        # (panel_rows set).
        self.edge = self.panel_rows = None
        if self.kcrs:
            self.zero_bias = placeholder(1, self.dtype)
        elif prepacked and panels:
            self.zero_bias = executor.plan_constants(plan)[0]
            self.panel_rows = plan.filters_per_tile
        elif not panels:
            # KCRS rows read in place (dot-product panels packed ahead are
            # those rows): the edge operand is constant where no group has
            # fewer than Nf filters.
            self.zero_bias, self.edge = executor.plan_constants(plan)
        # A bias that needs no packing: packed ahead, or its own panel.
        self.bias_ready = prepacked or executor.bias_is_its_panel(plan)
        # The nest's last arguments, the same every call (executor.nest_arguments).
        self.no_residual = placeholder(1, self.dtype)
        launch = self.launch
        self.tail = (launch.bounds,) if launch.offsets is None else (launch.offsets, launch.bounds)
        self.scratch = launch.constant_workspace
        self.numpy_output = plan.algorithm in UNALIGNED_OUTPUT_ALGORITHMS

    def quick_call(self, activation: int, x: np.ndarray, w: np.ndarray, bias):
        """``quick(x, w, bias)``: this plan's call into a new output, as
        :meth:`__call__` makes it with ``activation`` and no residual, for
        operands like ``x``, ``w`` and ``bias`` (ndarrays of the plan's dtype,
        the bias given or not), every argument that does not depend on them
        prepared once; or None where a call needs :meth:`__call__`'s steps
        (operands to convert, a bias to pack, a nest whose first call has
        not found its address yet, or a launch that cannot raise Numba's
        thread count itself).

        ``quick`` raises ``TypeError``, before any work, for operands of
        other types than the first call's (read-only, unaligned, not
        C-contiguous): its caller then takes :meth:`__call__`, which converts
        them (the launch is compiled for the first call's types only:
        :func:`~cso.macrokernel.workers.typed_launch`,
        :func:`~cso.quick_launch.typed_launch_kcrs`).  A KCRS plan's quick
        call is one compiled function (:mod:`cso.quick_launch`); the others
        a Python closure.  Every Python step costs several times more right
        after other work than warm: ``cso.conv2d``'s repeated call through
        the closure, EfficientNet-B0's depthwise layers at two threads in the
        benchmark's rounds on a Xeon, 3-8 microseconds a call less than
        through :meth:`__call__`.
        """
        dtype = self.dtype
        if x.dtype is not dtype or w.dtype is not dtype:
            return None
        if bias is not None and (bias.dtype is not dtype or not (self.kcrs or self.bias_ready)):
            return None
        if not (self.kcrs or self.panel_rows is not None or self.edge is not None):
            return None
        nest = self.launch.loop_nest
        sample = self._arguments(x, w, bias, activation)
        if self.threads == 1:
            head = (nest_address(nest.func, sample), 1, _NO_COUNTS)
        elif nest.dtype is dtype and nest.counted:
            head = (nest.address, nest.workers, nest.counts)
        else:
            return None
        if self.kcrs and len(self.tail) == 2:
            return self._kcrs_quick(head, activation, x, w, bias)
        shape, size, rows, scratch = self.shape, self.size, self.panel_rows, self.scratch
        elements = self.launch.workspace_elements
        numpy_output = self.numpy_output
        # What follows the filters (executor.nest_arguments' order).
        edge = () if self.kcrs or rows is not None else (self.edge,)
        no_bias = (self.zero_bias, False)
        epilogue = (self.no_residual, activation, False)
        tail = self.tail
        # Refuses arguments of other types than these (a read-only or
        # unaligned operand): the caller then takes __call__, which copies them.
        launch = typed_launch(head + sample)
        # (quick builds those arguments in line, as _arguments does: a
        # Python call less each call.)

        def quick(x, w, bias):
            if numpy_output:
                shaped = np.empty(shape, dtype)
                y = shaped.reshape(-1)
            else:
                y = aligned_empty(size, dtype)
                shaped = y.reshape(shape)
            filters = w.ravel()
            if rows is None:
                arguments = (x.ravel(), filters) + edge
            else:
                arguments = (x.ravel(), filters, filters[:rows])
            arguments += no_bias if bias is None else (bias.ravel(), True)
            work = scratch if scratch is not None else workspace(elements, dtype)
            launch(*head, *arguments, *epilogue, y, work, *tail)
            return shaped

        return quick

    def _kcrs_quick(self, head: tuple, activation: int, x, w, bias):
        """:meth:`quick_call`'s call for a KCRS plan (its nest's offsets and
        bounds last): :func:`~cso.quick_launch.launch_kcrs`, compiled for
        the types of ``x``, ``w`` and ``bias``, with its state, offsets and
        bounds (and the workspace, where constant) bound."""
        state = kcrs_state(
            head[0], head[1], head[2], self.zero_bias, self.no_residual, activation,
            not self.numpy_output, self.shape,
        )  # fmt: skip
        offsets, bounds = self.tail
        scratch, elements, dtype = self.scratch, self.launch.workspace_elements, self.dtype
        work = executor.nest_workspace(self.launch, dtype)
        launch = typed_launch_kcrs((state, work, offsets, bounds, x, w, bias))
        if scratch is not None:
            # The state holds the placeholders' addresses: shared arrays
            # cso.workspace.placeholder keeps for the life of the process.
            return functools.partial(launch, state, scratch, offsets, bounds)

        def quick(x, w, bias):
            return launch(state, workspace(elements, dtype), offsets, bounds, x, w, bias)

        return quick

    def _arguments(self, x, w, bias, activation: int) -> tuple:
        """The nest's arguments as ``quick_call``'s call passes them (into a
        new output): the types its launch is compiled for."""
        filters = w.ravel()
        if self.panel_rows is not None:
            arguments = (x.ravel(), filters, filters[: self.panel_rows])
        else:
            arguments = (x.ravel(), filters) + (() if self.kcrs else (self.edge,))
        arguments += (self.zero_bias, False) if bias is None else (bias.ravel(), True)
        work = executor.nest_workspace(self.launch, self.dtype)
        y = np.empty(self.size, self.dtype)
        return arguments + (self.no_residual, activation, False, y, work) + self.tail

    def __call__(
        self, x: np.ndarray, w: np.ndarray, bias, activation: int, residual=None
    ) -> np.ndarray:
        """``activation(conv(x, w) + bias + residual)``: ``w`` KCRS or the
        packed panels, ``bias`` None or a ``(K,)`` array or the packed bias,
        ``activation`` a code of :func:`~cso.analysis.choices.activation_code`,
        ``residual`` None or an array of the output's shape; all checked by
        the caller to be this plan's problem."""
        dtype = self.dtype
        if self.numpy_output:
            shaped = np.empty(self.shape, dtype)
            y = shaped.reshape(-1)
        else:
            # 64-byte aligned as cso.outputs.new_output makes it, without its reshape.
            y = aligned_empty(self.size, dtype)
            # Shaped now rather than after the nest, whose data leave this
            # Python step's in cold caches.
            shaped = y.reshape(self.shape)
        # A bias given per call that needs packing takes the general path.
        ready_bias = bias is None or self.bias_ready
        if self.kcrs or self.panel_rows is not None or (self.edge is not None and ready_bias):
            # executor.nest_arguments' order, built here without its calls:
            # on a Xeon at two threads, MobileNetV2's and EfficientNet-B0's
            # depthwise calls in interleaved rounds, 0.3-1.2 microseconds a
            # call less (three runs each, the old class beside this one).
            # executor.flat_operand's common case in line: an ndarray (not a
            # subclass) of the plan's own dtype object, C-contiguous and
            # writeable, is its view.
            flags = w.flags
            if (
                type(w) is np.ndarray and w.dtype is dtype
                and flags.c_contiguous and flags.writeable
            ):  # fmt: skip
                filters = w.ravel()
            else:
                filters = executor.flat_operand(w, dtype)
            flags = x.flags
            if (
                type(x) is np.ndarray and x.dtype is dtype
                and flags.c_contiguous and flags.writeable
            ):  # fmt: skip
                arguments = (x.ravel(), filters)
            else:
                arguments = (executor.flat_operand(x, dtype), filters)
            if self.panel_rows is not None:
                arguments += (filters[: self.panel_rows],)
            elif not self.kcrs:
                arguments += (self.edge,)
            if bias is None:
                arguments += (self.zero_bias, False)
            else:
                arguments += (executor.flat_operand(bias, dtype), True)
            if residual is None:
                arguments += (self.no_residual, activation, False)
            else:
                # In the output's dtype and layout; y is new, so they share no memory.
                arguments += (executor.flat_operand(residual, dtype), activation, True)
            scratch = self.scratch
            if scratch is None:
                scratch = workspace(self.launch.workspace_elements, dtype)
            arguments += (y, scratch) + self.tail
        else:
            if residual is not None:
                residual = executor.flat_operand(residual, dtype)
            if self.prepacked:
                operands = executor.prepacked_operands(w, bias, self.plan)
            else:
                operands = executor.filter_operands(w, bias, self.plan)
            if activation or residual is not None:
                epilogue = executor.Epilogue(activation, residual)
            else:
                epilogue = executor.NO_EPILOGUE
            arguments = executor.loop_arguments(self.launch, x, operands, y, epilogue)
        # executor.launch_nest in line: a one-thread nest, or a parallel one
        # whose compiled launch raises Numba's thread count to its workers
        # (ParallelNest.counted; where it cannot, launch_nest's way).
        if self.threads == 1:
            self.launch.loop_nest(*arguments)
            return shaped
        nest = self.launch.loop_nest
        if nest.dtype is dtype and nest.counted:
            # ParallelNest's call, once its first has found the nest's address.
            launch_workers(nest.address, nest.workers, nest.counts, *arguments)
        else:
            executor.launch_nest(self.plan, self.launch, arguments)
        return shaped
