"""Every operator cso.onnx runs, one node at a time, against onnx.reference."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import cso.onnx  # noqa: E402

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def single_node_model(
    op_type, inputs, attributes=None, constants=None, opset=17, outputs=1, output_type=F
):
    """A model of one ``op_type`` node: ``inputs`` a list of (name, array) fed at
    run time, then ``constants`` (name, array) as initializers (a name "" for an
    omitted input), in the node's input order; outputs of ``output_type``."""
    constants = constants or []
    names = [name for name, _ in inputs] + [name for name, _ in constants]
    node = helper.make_node(
        op_type, names, [f"y{i}" for i in range(outputs)], name="node", **(attributes or {})
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in inputs
        ],
        [helper.make_tensor_value_info(f"y{i}", output_type, None) for i in range(outputs)],
        [numpy_helper.from_array(a, name) for name, a in constants if name],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(model, feed, rtol=1e-5, atol=1e-6):
    """cso.onnx against onnx.reference on ``model``; its outputs' types and
    shapes (which onnx.checker wants) are set from the reference's results."""
    expected = ReferenceEvaluator(model).run(None, feed)
    for value, result in zip(model.graph.output, expected):
        value.CopyFrom(
            helper.make_tensor_value_info(
                value.name, helper.np_dtype_to_tensor_dtype(result.dtype), result.shape
            )
        )
    got = cso.onnx.InferenceSession(model, threads=1).run(None, feed)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


rng = np.random.default_rng(7)
X = rng.standard_normal((2, 3, 7, 6)).astype(np.float32) * 4
Y = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
ROW = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)

UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Erf", "HardSwish", "Identity"]


@pytest.mark.parametrize("op_type", UNARY)
def test_unary(op_type):
    check(single_node_model(op_type, [("x", X)]), {"x": X})


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_erf_keeps_the_input_type(dtype):
    # ONNX's Erf is T -> T: computed in float32 (float64 for float64) and
    # given back in the input's type, as onnx.reference does.
    x = X.astype(dtype)
    output_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    check(single_node_model("Erf", [("x", x)], output_type=output_type), {"x": x}, rtol=1e-3)


def test_sqrt():
    positive = np.abs(X) + 0.1
    check(single_node_model("Sqrt", [("x", positive)]), {"x": positive})


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcasting(op_type):
    check(single_node_model(op_type, [("a", X), ("b", ROW + 2)]), {"a": X, "b": ROW + 2})


def test_integer_division_truncates():
    a = np.array([7, -7, 5, -5], np.int64)
    b = np.array([2, 2, -3, -3], np.int64)
    check(single_node_model("Div", [("a", a), ("b", b)], output_type=I64), {"a": a, "b": b})


def test_pow():
    base = np.abs(X) + 0.5
    exponent = np.full((1,), 1.5, np.float32)
    check(single_node_model("Pow", [("a", base)], constants=[("b", exponent)]), {"a": base})


@pytest.mark.parametrize(
    "low, high", [(0.0, 6.0), (-1.0, None), (None, 2.0)], ids=["relu6", "min", "max"]
)
def test_clip(low, high):
    constants = [
        ("min" if low is not None else "", np.array(low, np.float32)),
        ("max", np.array(high, np.float32)) if high is not None else None,
    ]
    constants = [c for c in constants if c is not None]
    check(single_node_model("Clip", [("x", X)], constants=constants), {"x": X})


def test_hard_sigmoid():
    for attributes in ({}, {"alpha": 1 / 6, "beta": 0.5}):
        check(single_node_model("HardSigmoid", [("x", X)], attributes), {"x": X})


def test_matmul_and_gemm():
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    check(single_node_model("MatMul", [("a", a), ("b", b)]), {"a": a, "b": b})
    c = rng.standard_normal((3,)).astype(np.float32)
    bt = np.ascontiguousarray(b.T)
    model = single_node_model(
        "Gemm", [("a", a)], {"transB": 1, "alpha": 0.5, "beta": 2.0}, [("b", bt), ("c", c)]
    )
    check(model, {"a": a})
    at = np.ascontiguousarray(a.T)
    check(single_node_model("Gemm", [("a", at), ("b", b)], {"transA": 1}), {"a": at, "b": b})


@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 3], "ceil_mode": 1, "strides": [2, 2]},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 1]},
        {"kernel_shape": [2, 2], "dilations": [2, 1]},
    ],
)
def test_max_pool(attributes):
    check(single_node_model("MaxPool", [("x", X)], attributes), {"x": X})


@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "count_include_pad": 1},
        {"kernel_shape": [2, 2], "strides": [2, 2]},
    ],
)
def test_average_pool(attributes):
    check(single_node_model("AveragePool", [("x", X)], attributes), {"x": X})


def test_global_average_pool_and_reduce_mean():
    check(single_node_model("GlobalAveragePool", [("x", X)]), {"x": X})
    axes = np.array([2, 3], np.int64)
    check(single_node_model("ReduceMean", [("x", X)], constants=[("axes", axes)], opset=18),
          {"x": X})  # fmt: skip
    check(single_node_model("ReduceMean", [("x", X)], {"axes": [1], "keepdims": 0}, opset=13),
          {"x": X})  # fmt: skip


def test_concat_slice_reshape_flatten_transpose():
    check(single_node_model("Concat", [("a", X), ("b", Y)], {"axis": 1}), {"a": X, "b": Y})
    starts, ends = np.array([1, -4], np.int64), np.array([3, 100], np.int64)
    axes, steps = np.array([1, 3], np.int64), np.array([1, 2], np.int64)
    model = single_node_model(
        "Slice", [("x", X)], constants=[("s", starts), ("e", ends), ("a", axes), ("t", steps)]
    )
    check(model, {"x": X})
    shape = np.array([0, -1, 6], np.int64)
    check(single_node_model("Reshape", [("x", X)], constants=[("s", shape)]), {"x": X})
    check(single_node_model("Flatten", [("x", X)], {"axis": 2}), {"x": X})
    check(single_node_model("Transpose", [("x", X)], {"perm": [0, 2, 3, 1]}), {"x": X})


def test_shape_gather_unsqueeze_squeeze():
    check(single_node_model("Shape", [("x", X)], output_type=I64), {"x": X})
    model = single_node_model(
        "Shape", [("x", X)], {"start": 1, "end": -1}, opset=15, output_type=I64
    )
    check(model, {"x": X})
    indices = np.array([[0, 2], [-1, 1]], np.int64)
    check(single_node_model("Gather", [("x", X)], {"axis": 1}, [("i", indices)]), {"x": X})
    axes = np.array([0, -1], np.int64)
    check(single_node_model("Unsqueeze", [("x", X)], constants=[("a", axes)]), {"x": X})
    squeezable = X[:, :1, :, :1]
    model = single_node_model("Squeeze", [("x", squeezable)], constants=[("a", np.array([1, 3]))])
    check(model, {"x": squeezable})


def test_layer_normalization_and_softmax():
    scale = rng.standard_normal((6,)).astype(np.float32)
    bias = rng.standard_normal((6,)).astype(np.float32)
    model = single_node_model(
        "LayerNormalization", [("x", X)], {"epsilon": 1e-3}, [("s", scale), ("b", bias)]
    )
    check(model, {"x": X}, rtol=1e-4, atol=1e-5)
    check(single_node_model("Softmax", [("x", X)], {"axis": 1}), {"x": X})


def test_batch_normalization_unfused():
    channels = X.shape[1]
    parameters = [
        ("scale", rng.standard_normal(channels).astype(np.float32)),
        ("bias", rng.standard_normal(channels).astype(np.float32)),
        ("mean", rng.standard_normal(channels).astype(np.float32)),
        ("var", np.abs(rng.standard_normal(channels)).astype(np.float32) + 0.5),
    ]
    model = single_node_model("BatchNormalization", [("x", X)], {"epsilon": 1e-3}, parameters)
    check(model, {"x": X}, rtol=1e-5, atol=1e-5)


def test_cast_constant_dropout():
    model = single_node_model("Cast", [("x", X)], {"to": I64}, output_type=I64)
    check(model, {"x": X})
    check(single_node_model("Dropout", [("x", X)]), {"x": X})
    constant = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(ROW, "value"))
    add = helper.make_node("Add", ["x", "c"], ["y"])
    graph = helper.make_graph(
        [constant, add], "g", [helper.make_tensor_value_info("x", F, X.shape)],
        [helper.make_tensor_value_info("y", F, None)],
    )  # fmt: skip
    check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": X})


def test_operators_of_transformer_exports():
    """What torchvision's ViT, Swin and MaxViT exports use besides the above."""
    shape = np.array([2, 3], np.int64)
    model = single_node_model(
        "ConstantOfShape", [("s", shape)],
        {"value": numpy_helper.from_array(np.array([1.5], np.float32))},
    )  # fmt: skip
    check(model, {"s": shape})
    row = X[:1, :, :1, :]
    target = np.array([2, 3, 7, 1], np.int64)
    check(single_node_model("Expand", [("x", row)], constants=[("s", target)]), {"x": row})
    a = np.array([5, -5, 7, -7], np.int64)
    b = np.array([3, 3, -2, -2], np.int64)
    check(single_node_model("Mod", [("a", a), ("b", b)], output_type=I64), {"a": a, "b": b})
    check(single_node_model("Mod", [("a", X), ("b", ROW + 3)], {"fmod": 1}), {"a": X, "b": ROW + 3})
    equal = single_node_model("Equal", [("a", a), ("b", b)], output_type=TensorProto.BOOL)
    check(equal, {"a": a, "b": b})
    mask = X > 0
    check(single_node_model("Not", [("m", mask)], output_type=TensorProto.BOOL), {"m": mask})
    check(
        single_node_model("Where", [("m", mask), ("a", X), ("b", Y)]), {"m": mask, "a": X, "b": Y}
    )
    pads = np.array([0, 1, 2, 0, 0, 0, 1, 3], np.int64)
    check(single_node_model("Pad", [("x", X)], constants=[("p", pads)]), {"x": X})
    check(single_node_model("Pad", [("x", X)], {"mode": "reflect"}, [("p", pads)]), {"x": X})
    limits = [
        ("s", np.array(1, np.int64)),
        ("l", np.array(10, np.int64)),
        ("d", np.array(3, np.int64)),
    ]
    check(single_node_model("Range", [], constants=limits, output_type=I64), {})
    indices = np.array([[0, 1], [1, 2]], np.int64)
    updates = rng.standard_normal((2, 7, 6)).astype(np.float32)
    model = single_node_model("ScatterND", [("x", X)], constants=[("i", indices), ("u", updates)])
    check(model, {"x": X})
    a, b = X.reshape(2, 3, 42), Y.reshape(2, 42, 3)
    check(single_node_model("Einsum", [("a", a), ("b", b)], {"equation": "bij,bjk->bik"}),
          {"a": a, "b": b}, rtol=1e-4, atol=1e-4)  # fmt: skip


def test_matmul_of_higher_rank_input_runs_as_a_convolution():
    """A Linear layer on (batch, tokens, features): MatMul by constant weights, then
    Add of a constant bias, is one fused 1x1 convolution."""
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    weights = rng.standard_normal((8, 6)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    matmul = helper.make_node("MatMul", ["x", "w"], ["h"], name="linear")
    add = helper.make_node("Add", ["h", "b"], ["y"], name="bias")
    graph = helper.make_graph(
        [matmul, add], "g", [helper.make_tensor_value_info("x", F, x.shape)],
        [helper.make_tensor_value_info("y", F, (2, 5, 6))],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check(model, {"x": x}, rtol=1e-4, atol=1e-5)
    session = cso.onnx.InferenceSession(model)
    assert session.steps == ["MatMul node 'linear' (+ Add)"]
