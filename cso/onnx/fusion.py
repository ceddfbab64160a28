"""Graph rewriting: each ``Conv`` takes in what follows it.

For every ``Conv`` whose output is read by one node only (and is not a graph
output), in this order:

1. a ``BatchNormalization`` with constant parameters is folded into the
   filters and bias: ``w' = w * s``, ``b' = (b - mean) * s + beta`` with
   ``s = gamma / sqrt(var + epsilon)`` per output channel;
2. an ``Add`` of another value becomes the convolution's residual;
3. an activation becomes its epilogue's: ``Relu``; ``Clip`` to [0, 6]
   (relu6) or [0, inf) (relu); ``Sigmoid``; ``Sigmoid`` then ``Mul`` by the
   convolution's own output (silu); ``HardSigmoid`` with PyTorch's
   alpha = 1/6, beta = 1/2; ``HardSwish``.

A ``Gemm`` (or ``MatMul``) of an input by constant weights is a 1x1
convolution of an ``(N, K, 1, 1)`` input by ``(M, K, 1, 1)`` filters (the
dot-product micro-kernel's case), and takes in an activation the same way:
so a model's classifier needs no BLAS, whose worker threads keep spinning
after each call and slowed the convolutions of the next run 2-3x.

A ``Conv`` whose input is a feature map times a per-channel gate (``Mul``
by an (N, C, 1, 1) value: a squeeze-excite block) takes the ``Mul`` in too:
for one image, ``conv(x * g, w)`` is ``conv(x, w * g)``, and scaling the
filters costs ``K * C * R * S`` multiplies against the feature map's
``C * H * W`` (chosen at run time, per call, by those sizes).

The fused convolution runs where the last node it took in stood, so the
residual has been computed by then; nothing else read its intermediate
values.  The ``Add`` and activation nodes are kept beside it
(``FusedConv.absorbed``), to run in NumPy should the residual turn out at run
time not to have the output's shape (a broadcast add).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .graph import Graph, Node


@dataclass
class FusedConv:
    """A ``Conv`` node and what it took in."""

    node: Node
    weights: np.ndarray  # constant filters (BN folded in), or None when computed
    bias: np.ndarray  # constant bias, or None
    output: str
    activation: str = None
    residual: str = None
    absorbed: list = field(default_factory=list)  # Add and activation nodes
    folded: list = field(default_factory=list)  # BatchNormalization nodes
    matrix: bool = False  # a Gemm or MatMul: (N, K) times constant filters (M, K, 1, 1)
    input: str = None  # the value convolved (the node's first input unless a gate was taken in)
    input_gate: str = None  # a per-channel (N, C, 1, 1) factor of the input, taken in
    gated: Node = None  # the Mul that applied it

    def __post_init__(self):
        if self.input is None:
            self.input = self.node.inputs[0]

    def reads(self) -> list:
        """Every value the fused step may read (its fallbacks included)."""
        names = [self.input] + list(self.node.inputs[1:])
        names += [self.residual, self.input_gate]
        for node in self.absorbed + ([self.gated] if self.gated else []):
            names.extend(node.inputs)
        if self.gated is not None:
            names.append(self.gated.outputs[0])  # written only when the gate is applied apart
        return [name for name in names if name]

    def describe(self) -> str:
        taken = [
            n.op_type for n in ([self.gated] if self.gated else []) + self.folded + self.absorbed
        ]
        return self.node.describe() + (f" (+ {' + '.join(taken)})" if taken else "")


def fuse(graph: Graph) -> list:
    """The steps to run: ``graph.nodes`` with each ``Conv`` (and what it took
    in) replaced by a :class:`FusedConv`, in an order that computes every
    value before it is read."""
    nodes = graph.nodes
    constants = graph.constants
    position = {id(node): index for index, node in enumerate(nodes)}
    consumers = defaultdict(list)
    for node in nodes:
        for name in set(node.inputs):
            if name:
                consumers[name].append(node)
    graph_outputs = {value.name for value in graph.outputs}

    placed = {}  # position -> FusedConv
    taken = set()  # ids of the nodes a FusedConv stands for

    def sole_consumer(name):
        readers = consumers.get(name, [])
        if name in graph_outputs or len(readers) != 1 or id(readers[0]) in taken:
            return None
        return readers[0]

    for node in nodes:
        if id(node) in taken:
            continue
        if node.op_type in ("Gemm", "MatMul"):
            step = _matrix_step(node, constants)
            if step is None:
                continue
            bias_name = None
        elif node.op_type == "Conv":
            weights = constants.get(node.inputs[1])
            bias_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
            bias = constants.get(bias_name) if bias_name else None
            step = FusedConv(node, weights, bias, node.outputs[0])
        else:
            continue
        last = position[id(node)]

        gate = _input_gate(node, nodes, graph, sole_consumer) if not step.matrix else None
        if gate is not None and step.weights is not None:
            # A squeeze-excite gate: conv(x * g) is conv(x) with filters scaled by g.
            multiply, feature, gate_name = gate
            step.input, step.input_gate, step.gated = feature, gate_name, multiply
            taken.add(id(multiply))

        following = sole_consumer(step.output)
        if step.matrix:
            # A Linear layer's MatMul + Add of a constant (M,) vector: the bias.
            if step.bias is None and following is not None and following.op_type == "Add":
                other = [n for n in following.inputs if n != step.output]
                vector = constants.get(other[0]) if len(other) == 1 else None
                if (
                    vector is not None
                    and vector.dtype == step.weights.dtype
                    and vector.shape == (step.weights.shape[0],)
                ):
                    step.bias = vector
                    step.absorbed.append(following)
                    step.output = following.outputs[0]
                    taken.add(id(following))
                    last = max(last, position[id(following)])
            following = None  # a residual of the matrix product is left to NumPy
        if following is not None and following.op_type == "BatchNormalization":
            folded = _fold_batch_norm(step, following, constants, bias_name)
            if folded:
                taken.add(id(following))
                last = max(last, position[id(following)])

        following = None if step.matrix else sole_consumer(step.output)
        if following is not None and following.op_type == "Add":
            a, b = following.inputs
            other = b if a == step.output else a
            if other != step.output:
                step.residual = other
                step.absorbed.append(following)
                step.output = following.outputs[0]
                taken.add(id(following))
                last = max(last, position[id(following)])

        activation, absorbed = _activation_after(step.output, sole_consumer, consumers, constants,
                                                 graph_outputs)  # fmt: skip
        if activation is not None:
            step.activation = activation
            step.absorbed.extend(absorbed)
            step.output = absorbed[-1].outputs[0]
            for absorbed_node in absorbed:
                taken.add(id(absorbed_node))
                last = max(last, position[id(absorbed_node)])
        taken.add(id(node))
        placed[last] = step

    steps = []
    for index, node in enumerate(nodes):
        if index in placed:
            steps.append(placed[index])
        elif id(node) not in taken:
            steps.append(node)
    return steps


def _input_gate(node: Node, nodes, graph: Graph, sole_consumer):
    """``(mul, feature, gate)`` when ``node``'s input is ``Mul(feature, gate)``,
    read by ``node`` alone, with ``gate`` of shape (N, C, 1, 1) and
    ``feature`` (N, C, H, W) by shape inference; else None."""
    producer = next((n for n in nodes if node.inputs[0] in n.outputs), None)
    if producer is None or producer.op_type != "Mul" or sole_consumer(node.inputs[0]) is not node:
        return None
    shapes = [graph.shapes.get(name) for name in producer.inputs]
    for feature, gate, (feature_shape, gate_shape) in (
        (producer.inputs[0], producer.inputs[1], shapes),
        (producer.inputs[1], producer.inputs[0], shapes[::-1]),
    ):
        if (
            feature_shape is not None
            and gate_shape is not None
            and len(feature_shape) == 4
            and len(gate_shape) == 4
            and tuple(gate_shape[2:]) == (1, 1)
            and gate_shape[1] == feature_shape[1]
            and isinstance(gate_shape[1], int)
            and tuple(feature_shape[2:]) != (1, 1)
        ):
            return producer, feature, gate
    return None


def _matrix_step(node: Node, constants):
    """A :class:`FusedConv` for a ``Gemm`` or ``MatMul`` of an input by a
    constant 2-D float matrix (and a constant bias), or None for any other."""
    attributes = node.attributes
    weights = constants.get(node.inputs[1])
    if node.inputs[0] in constants or weights is None or np.ndim(weights) != 2:
        return None
    if weights.dtype not in (np.float32, np.float64):
        return None
    bias = None
    if node.op_type == "Gemm":
        if attributes.get("transA", 0) or attributes.get("alpha", 1.0) != 1.0:
            return None
        if not attributes.get("transB", 0):
            weights = weights.T
        if len(node.inputs) > 2 and node.inputs[2]:
            bias = constants.get(node.inputs[2])
            if bias is None or attributes.get("beta", 1.0) != 1.0 or bias.dtype != weights.dtype:
                return None
            if bias.size != weights.shape[0] or bias.ndim > 2:
                return None  # a bias that broadcasts along the batch too
            bias = bias.reshape(-1)
    else:
        weights = weights.T
    filters = np.ascontiguousarray(weights).reshape(weights.shape + (1, 1))
    return FusedConv(node, filters, bias, node.outputs[0], matrix=True)


def _fold_batch_norm(step: FusedConv, norm: Node, constants, bias_name) -> bool:
    """Fold ``norm`` into ``step``'s constant filters and bias; False when it
    cannot be (parameters not constant, or its training outputs are read)."""
    parameters = [constants.get(name) for name in norm.inputs[1:5]]
    if step.weights is None or any(p is None for p in parameters):
        return False
    if bias_name is not None and step.bias is None:
        return False
    if any(name for name in norm.outputs[1:]):
        return False
    gamma, beta, mean, variance = (np.asarray(p, dtype=np.float64) for p in parameters)
    epsilon = float(norm.attributes.get("epsilon", 1e-5))
    scale = gamma / np.sqrt(variance + epsilon)
    dtype = step.weights.dtype
    bias = np.zeros(step.weights.shape[0]) if step.bias is None else step.bias.astype(np.float64)
    step.weights = (step.weights.astype(np.float64) * scale[:, None, None, None]).astype(dtype)
    step.bias = ((bias - mean) * scale + beta).astype(dtype)
    step.output = norm.outputs[0]
    step.folded.append(norm)
    return True


def _constant_scalar(name, constants):
    if not name or name not in constants:
        return None
    value = np.asarray(constants[name])
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _activation_after(value, sole_consumer, consumers, constants, graph_outputs):
    """``(activation, nodes)`` applied to ``value`` by the nodes after it, or ``(None, [])``."""
    following = sole_consumer(value)
    if following is not None:
        op = following.op_type
        if op == "Relu":
            return "relu", [following]
        if op == "HardSwish":
            return "hardswish", [following]
        if op == "HardSigmoid":
            alpha = following.attributes.get("alpha", 0.2)
            beta = following.attributes.get("beta", 0.5)
            if abs(alpha - 1 / 6) < 1e-6 and abs(beta - 0.5) < 1e-6:
                return "hardsigmoid", [following]
        if op == "Clip":
            inputs = following.inputs
            low = _constant_scalar(inputs[1] if len(inputs) > 1 else "", constants)
            high = _constant_scalar(inputs[2] if len(inputs) > 2 else "", constants)
            low = following.attributes.get("min", low)
            high = following.attributes.get("max", high)
            if low == 0.0 and high == 6.0:
                return "relu6", [following]
            if low == 0.0 and high is None and not (len(inputs) > 2 and inputs[2]):
                return "relu", [following]
        if op == "Sigmoid":
            return "sigmoid", [following]
    # silu: x * sigmoid(x), x read by exactly the Sigmoid and the Mul.
    readers = consumers.get(value, [])
    if value in graph_outputs or len(readers) != 2:
        return None, []
    sigmoid = next((n for n in readers if n.op_type == "Sigmoid"), None)
    multiply = next((n for n in readers if n.op_type == "Mul"), None)
    if sigmoid is None or multiply is None:
        return None, []
    gate = sigmoid.outputs[0]
    if sole_consumer(gate) is multiply and sorted(multiply.inputs) == sorted([value, gate]):
        return "silu", [sigmoid, multiply]
    return None, []
