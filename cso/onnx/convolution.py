"""A fused ``Conv`` step of a session: ONNX's attributes in cso's terms, the
filters packed once per input shape, and the call with its epilogue.
"""

from __future__ import annotations

import numpy as np

from ..conv import conv2d
from ..packed import pack_filters
from .fusion import FusedConv
from .graph import ModelError
from .operators import OPERATORS

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class ConvStep:
    """Runs one :class:`~cso.onnx.fusion.FusedConv` on ``threads`` workers.

    Constant filters are packed (:func:`cso.pack_filters`) for each input
    shape the step meets, once: at session creation for the shape that
    shape inference gives (a symbolic batch taken as 1), on first use for
    any other.  Packed filters replan a new batch size by themselves.
    """

    def __init__(self, step: FusedConv, threads: int):
        self.step = step
        self.threads = threads
        node = step.node
        attributes = node.attributes
        if step.weights is not None:
            if step.weights.ndim != 4:
                raise ModelError(
                    f"{node.describe()}: only 2-D convolutions are supported, got filters of "
                    f"shape {step.weights.shape}"
                )
            if step.weights.dtype not in _FLOATS:
                raise ModelError(
                    f"{node.describe()}: filters must be float32 or float64, got "
                    f"{step.weights.dtype}"
                )
            kernel = attributes.get("kernel_shape")
            if kernel is not None and tuple(kernel) != step.weights.shape[2:]:
                raise ModelError(
                    f"{node.describe()}: kernel_shape {tuple(kernel)} differs from the "
                    f"filters' {step.weights.shape[2:]}"
                )
        self.strides = tuple(attributes.get("strides", (1, 1)))
        self.dilations = tuple(attributes.get("dilations", (1, 1)))
        self.groups = int(attributes.get("group", 1))
        self.auto_pad = attributes.get("auto_pad", "NOTSET")
        pads = tuple(attributes.get("pads", (0, 0, 0, 0)))
        if len(self.strides) != 2 or len(self.dilations) != 2 or len(pads) != 4:
            raise ModelError(
                f"{node.describe()}: strides, dilations and pads must have 2, 2 and 4 entries "
                f"for a 2-D convolution, got {self.strides}, {self.dilations}, {pads}"
            )
        if self.auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
            raise ModelError(f"{node.describe()}: auto_pad {self.auto_pad!r} is not known")
        self.pads = ((pads[0], pads[2]), (pads[1], pads[3]))
        self._packed = {}

    def padding(self, input_shape, kernel):
        """``((top, bottom), (left, right))`` for an input of ``input_shape``
        and filters of ``kernel`` (R, S)."""
        if self.auto_pad == "NOTSET":
            return self.pads
        if self.auto_pad == "VALID":
            return ((0, 0), (0, 0))
        pairs = []
        for extent, size, stride, dilation in zip(
            input_shape[2:], kernel, self.strides, self.dilations
        ):
            out = -(-extent // stride)
            total = max(0, (out - 1) * stride + dilation * (size - 1) + 1 - extent)
            small, large = total // 2, total - total // 2
            pairs.append((small, large) if self.auto_pad == "SAME_UPPER" else (large, small))
        return tuple(pairs)

    def prepare(self, input_shape, dtype) -> None:
        """Pack the constant filters for inputs of ``input_shape`` and ``dtype``."""
        if self.step.weights is None:
            return
        key = (tuple(input_shape[1:]), np.dtype(dtype))
        if key in self._packed:
            return
        self._packed[key] = pack_filters(
            self.step.weights,
            tuple(input_shape),
            stride=self.strides,
            padding=self.padding(input_shape, self.step.weights.shape[2:]),
            dilation=self.dilations,
            groups=self.groups,
            bias=self.step.bias,
            dtype=np.result_type(dtype, self.step.weights.dtype, np.float32),
            threads=self.threads,
        )

    def packed_filters(self):
        """The filters packed for the first input shape prepared, or None."""
        return next(iter(self._packed.values()), None)

    def adopt(self, packed, name) -> None:
        """Use ``packed`` (read back from a saved session, where it is layer
        ``name``) for its input shape, once it is checked to be this step's
        convolution."""
        from ..geometry import make_geometry
        from ..packed_file import PackedFormatError

        weights = self.step.weights
        input_shape = tuple(packed.input_shape)
        expected = None
        if weights is not None and len(input_shape) == 4:
            try:
                expected = make_geometry(
                    input_shape, weights.shape, stride=self.strides,
                    padding=self.padding(input_shape, weights.shape[2:]),
                    dilation=self.dilations, groups=self.groups,
                )  # fmt: skip
            except ValueError:
                expected = None  # shapes this convolution cannot take
        if expected is None or packed.plan.geometry != expected:
            raise PackedFormatError(
                f"saved layer {name!r} is not the convolution of {self.step.node.describe()}"
            )
        # Another thread count is fine: conv2d replans packed filters for it.
        self._packed[(input_shape[1:], np.dtype(packed.dtype))] = packed

    def run(self, values: dict) -> None:
        """Compute the step's output into ``values`` from the values it reads."""
        step = self.step
        node = step.node
        x = values[step.input]
        filters = None  # (weights, bias) read in the call, or None for the packed ones
        if step.weights is None:
            bias = values[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else None
            filters = (values[node.inputs[1]], bias)
        if step.input_gate is not None:
            gate = values[step.input_gate]
            if self._scale_filters(x, gate):
                filters = (self._scaled_filters(gate), step.bias)
            else:
                run_node(step.gated, values)  # the feature map times its gate, in NumPy
                x = values[step.gated.outputs[0]]
        leading = None
        if step.matrix:
            if x.ndim < 2 or x.dtype != step.weights.dtype or x.shape[-1] != step.weights.shape[1]:
                # Not vectors these weights multiply: the nodes as they were, in NumPy.
                for original in [node] + step.absorbed:
                    run_node(original, values)
                return
            # Every vector along the last axis is an image of K channels and 1x1 pixels.
            leading = x.shape[:-1]
            x = x.reshape((-1, x.shape[-1], 1, 1))
        if x.ndim != 4 or x.dtype not in _FLOATS:
            raise ModelError(
                f"{node.describe()}: input {step.input!r} must be a 4-D float32 or float64 "
                f"array, got {x.ndim}-D {x.dtype}"
            )
        if filters is not None:
            weights, bias = filters
            arguments = dict(
                w=weights,
                bias=bias,
                stride=self.strides,
                padding=self.padding(x.shape, weights.shape[2:]),
                dilation=self.dilations,
                groups=self.groups,
            )  # fmt: skip
        else:
            self.prepare(x.shape, x.dtype)
            arguments = dict(w=self._packed[(tuple(x.shape[1:]), x.dtype)])
        residual = values[step.residual] if step.residual is not None else None
        output_shape = conv_output_shape(x.shape, arguments)
        if residual is None or (residual.shape == output_shape and residual.dtype == x.dtype):
            y = conv2d(
                x, **arguments, activation=step.activation, residual=residual,
                threads=self.threads,
            )  # fmt: skip
            values[step.output] = y if leading is None else y.reshape(leading + (y.shape[1],))
            return
        # A residual that broadcasts: the convolution alone, then the nodes it took in.
        values[step.absorbed[0].inputs[0]] = conv2d(x, **arguments, threads=self.threads)
        for absorbed in step.absorbed:
            run_node(absorbed, values)

    def _scale_filters(self, x, gate) -> bool:
        """Whether to fold the gate into the filters: one image, shapes as
        planned, and fewer filter elements than feature-map elements."""
        w = self.step.weights
        return (
            x.ndim == 4
            and x.shape[0] == 1
            and gate.shape == (1, x.shape[1], 1, 1)
            and gate.dtype == x.dtype == w.dtype
            and w.size < x.size
        )

    def _scaled_filters(self, gate):
        """The filters times the gate of their input channels (``conv(x * g, w)
        = conv(x, w * g)`` for one image): channel ``g*C_g + c`` of group ``g``."""
        w = self.step.weights
        factors = gate.reshape(self.groups, w.shape[1])
        by_group = w.reshape((self.groups, -1) + w.shape[1:])
        return (by_group * factors[:, None, :, None, None]).reshape(w.shape)


def conv_output_shape(input_shape, arguments):
    """``(N, K, P, Q)`` of the step's convolution of ``input_shape``."""
    w = arguments["w"]
    if hasattr(w, "plan"):
        geometry = w.plan.geometry
        k, p, q = geometry.output_shape[1:]
        return (input_shape[0], k, p, q)
    from ..geometry import make_geometry

    geometry = make_geometry(
        input_shape, w.shape, stride=arguments["stride"], padding=arguments["padding"],
        dilation=arguments["dilation"], groups=arguments["groups"],
    )  # fmt: skip
    return geometry.output_shape


def run_node(node, values: dict) -> None:
    """Run an ONNX node (not a ``Conv``) in NumPy, its outputs into ``values``."""
    inputs = [values[name] if name else None for name in node.inputs]
    # Trailing omitted inputs are as good as absent.
    while inputs and inputs[-1] is None:
        inputs.pop()
    try:
        outputs = OPERATORS[node.op_type](inputs, node.attributes)
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise RuntimeError(f"{node.describe()} failed: {error}") from error
    for name, value in zip(node.outputs, outputs):
        if name:
            values[name] = np.asarray(value)
