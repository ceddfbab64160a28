"""An ONNX model read, checked and turned into plain Python: nodes, constants, shapes.

Nothing in a model is trusted before it is checked: the file is parsed by
``onnx`` and passed through ``onnx.checker``; then every node's op type must
be one cso runs (:data:`SUPPORTED`), every input a node reads must be a
graph input, an initializer or an earlier node's output (ONNX requires the
nodes in topological order), and no value may be written twice.  Each
failure is a :class:`ModelError` naming the node and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .operators import OPERATORS

SUPPORTED = frozenset(OPERATORS) | {"Conv", "Constant"}

# Value types as onnxruntime's NodeArg.type names them.
_TYPE_NAMES = {
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float64): "tensor(double)",
    np.dtype(np.float16): "tensor(float16)",
    np.dtype(np.int64): "tensor(int64)",
    np.dtype(np.int32): "tensor(int32)",
    np.dtype(np.int8): "tensor(int8)",
    np.dtype(np.uint8): "tensor(uint8)",
    np.dtype(np.bool_): "tensor(bool)",
}


class ModelError(ValueError):
    """A model cso cannot run, with the node or value that makes it so."""


@dataclass(frozen=True)
class Node:
    """One node: ``inputs`` with ``""`` for an omitted optional input."""

    op_type: str
    name: str
    inputs: tuple
    outputs: tuple
    attributes: dict = field(default_factory=dict, compare=False, hash=False)

    def describe(self) -> str:
        return f"{self.op_type} node {self.name!r}" if self.name else f"a {self.op_type} node"


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: ``shape`` has an int, a symbol (str) or None per axis."""

    name: str
    dtype: np.dtype
    shape: tuple

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.dtype, f"tensor({self.dtype.name})")


@dataclass
class Graph:
    """A checked model: its inputs and outputs, constants, nodes, and the shapes
    ONNX shape inference found (``shapes[name]``: a tuple with None where unknown)."""

    inputs: list
    outputs: list
    constants: dict
    nodes: list
    shapes: dict
    opset: int


def load_model(path_or_model):
    """The ``onnx.ModelProto`` of a path, serialized bytes or a model, checked.

    Raises
    ------
    ModelError
        The file is missing or not an ONNX model, or ``onnx.checker`` refuses it.
    TypeError
        ``path_or_model`` is none of these.
    """
    import onnx

    if isinstance(path_or_model, onnx.ModelProto):
        model = path_or_model
    elif isinstance(path_or_model, (bytes, bytearray)):
        try:
            model = onnx.load_model_from_string(bytes(path_or_model))
        except Exception as error:
            raise ModelError(f"path_or_model: the bytes are not an ONNX model: {error}") from None
    elif isinstance(path_or_model, (str, os.PathLike)):
        path = os.fspath(path_or_model)
        if not os.path.isfile(path):
            raise ModelError(f"path_or_model: no such file: {path!r}")
        try:
            model = onnx.load(path)
        except Exception as error:
            raise ModelError(f"path_or_model: {path!r} is not an ONNX model: {error}") from None
    else:
        raise TypeError(
            "path_or_model must be a path, the bytes of a model or an onnx.ModelProto, "
            f"got {type(path_or_model).__name__}"
        )
    try:
        onnx.checker.check_model(model)
    except Exception as error:
        raise ModelError(f"the model fails onnx.checker: {error}") from None
    return model


def read_graph(model) -> Graph:
    """The :class:`Graph` of a checked ``onnx.ModelProto``."""
    import onnx
    from onnx import helper, numpy_helper

    opset = max(
        (entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")),
        default=0,
    )
    graph = model.graph
    constants = {}
    for tensor in graph.initializer:
        constants[tensor.name] = numpy_helper.to_array(tensor)
    nodes = []
    known = set(constants)
    inputs = []
    for value in graph.input:
        if value.name in constants:
            continue  # an initializer listed as an input (older exporters): a constant
        inputs.append(_value_info(value))
        known.add(value.name)
    for index, proto in enumerate(graph.node):
        node = Node(
            proto.op_type,
            proto.name or f"#{index}",
            tuple(proto.input),
            tuple(proto.output),
            {a.name: _attribute(helper.get_attribute_value(a)) for a in proto.attribute},
        )
        if proto.domain not in ("", "ai.onnx"):
            raise ModelError(
                f"{node.describe()}: operators of domain {proto.domain!r} are not supported"
            )
        if node.op_type not in SUPPORTED:
            raise ModelError(
                f"{node.describe()}: operator {node.op_type!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED))})"
            )
        for name in node.inputs:
            if name and name not in known:
                raise ModelError(
                    f"{node.describe()}: input {name!r} is neither a graph input, an initializer "
                    "nor the output of an earlier node"
                )
        for name in node.outputs:
            if name and name in known:
                raise ModelError(f"{node.describe()}: output {name!r} is written twice")
            known.add(name)
        if node.op_type == "Constant":
            constants[node.outputs[0]] = _constant_value(node)
        else:
            nodes.append(node)
    outputs = [_value_info(value) for value in graph.output]
    for value in outputs:
        if value.name not in known:
            raise ModelError(f"graph output {value.name!r} is computed by no node")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        shapes = {
            value.name: _value_info(value).shape
            for value in list(inferred.graph.value_info) + list(inferred.graph.output)
        }
    except Exception:  # shapes only help planning ahead; run() plans what it meets
        shapes = {}
    for value in inputs:
        shapes[value.name] = value.shape
    return Graph(inputs, outputs, constants, nodes, shapes, opset)


# Nodes whose inputs are all constants are computed when the model is read;
# an Identity of an initializer (exporters write them for shared weights) is
# how a Conv's filters often arrive.  Large results are left to run time.
_FOLDED_ELEMENTS = 1 << 20


def fold_constants(graph: Graph, run_node) -> None:
    """Compute, once, every node of ``graph`` that reads only constants (and
    writes at most ``2**20`` elements), adding its outputs to the constants."""
    kept = []
    for node in graph.nodes:
        if node.op_type != "Conv" and all(
            not name or name in graph.constants for name in node.inputs
        ):
            values = dict(graph.constants)
            run_node(node, values)
            outputs = {name: values[name] for name in node.outputs if name}
            if all(np.asarray(v).size <= _FOLDED_ELEMENTS for v in outputs.values()):
                graph.constants.update(outputs)
                continue
        kept.append(node)
    graph.nodes = kept


def _value_info(value) -> ValueInfo:
    from onnx import helper

    tensor = value.type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except Exception:
        raise ModelError(
            f"value {value.name!r}: element type {tensor.elem_type} is not supported"
        ) from None
    shape = None
    if tensor.HasField("shape"):
        shape = tuple(
            dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
            for dim in tensor.shape.dim
        )
    return ValueInfo(value.name, dtype, shape)


def _attribute(value):
    """An attribute as plain Python: strings decoded, tensors as arrays."""
    from onnx import TensorProto, numpy_helper

    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in value]
    return value


def _constant_value(node: Node) -> np.ndarray:
    attributes = node.attributes
    if "value" in attributes:
        return np.asarray(attributes["value"])
    for name, dtype in (
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if name in attributes:
            return np.asarray(attributes[name], dtype=dtype)
    raise ModelError(f"{node.describe()}: only tensor, float and int constants are supported")
