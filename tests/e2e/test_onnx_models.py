"""Small ResNet- and MobileNet-style graphs end to end, fusion, and every bad model and input."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import cso.onnx  # noqa: E402
from cso.onnx import ModelError  # noqa: E402

F = TensorProto.FLOAT
rng = np.random.default_rng(11)


class GraphBuilder:
    """Nodes, initializers and one float input, built up layer by layer."""

    def __init__(self, input_shape):
        self.nodes, self.initializers, self.count = [], [], 0
        self.input_shape = input_shape

    def constant(self, array):
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type, inputs, outputs=1, **attributes):
        self.count += 1
        names = [f"v{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(
            helper.make_node(op_type, inputs, names, name=f"{op_type}_{self.count}", **attributes)
        )
        return names[0] if outputs == 1 else names

    def conv(self, x, channels, filters, kernel, stride=1, groups=1, bias=True, bn=False):
        w = rng.standard_normal((filters, channels // groups, kernel, kernel)).astype(np.float32)
        w *= np.sqrt(2.0 / (channels // groups * kernel * kernel))
        inputs = [x, self.constant(w)]
        if bias:
            inputs.append(self.constant(rng.standard_normal(filters).astype(np.float32) * 0.1))
        y = self.node(
            "Conv", inputs, kernel_shape=[kernel, kernel], strides=[stride, stride],
            pads=[kernel // 2] * 4, group=groups,
        )  # fmt: skip
        if bn:
            parameters = [
                rng.uniform(0.5, 1.5, filters), rng.standard_normal(filters) * 0.1,
                rng.standard_normal(filters) * 0.1, rng.uniform(0.5, 1.5, filters),
            ]  # fmt: skip
            names = [self.constant(p.astype(np.float32)) for p in parameters]
            y = self.node("BatchNormalization", [y] + names, epsilon=1e-5)
        return y

    def model(self, output, opset=17):
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info("input", F, self.input_shape)],
            [helper.make_tensor_value_info(output, F, None)], self.initializers,
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        inferred = onnx.shape_inference.infer_shapes(model)
        model.graph.output[0].CopyFrom(inferred.graph.output[0])
        return model


def resnet_style():
    """Stem conv+BN+relu, max pool, two bottleneck blocks (one with a projection),
    global average pool, flatten, gemm."""
    g = GraphBuilder([1, 3, 32, 32])
    x = g.node("Relu", [g.conv("input", 3, 16, 3, stride=2, bias=False, bn=True)])
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for channels, filters, stride in ((16, 32, 2), (32, 32, 1)):
        y = g.node("Relu", [g.conv(x, channels, 8, 1, bn=True)])
        y = g.node("Relu", [g.conv(y, 8, 8, 3, stride=stride, bn=True)])
        y = g.conv(y, 8, filters, 1, bn=True)
        shortcut = x
        if stride != 1 or channels != filters:
            shortcut = g.conv(x, channels, filters, 1, stride=stride, bn=True)
        x = g.node("Relu", [g.node("Add", [y, shortcut])])
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    w = g.constant(rng.standard_normal((10, 32)).astype(np.float32) * 0.3)
    b = g.constant(rng.standard_normal(10).astype(np.float32))
    # The reduction lengths C/groups*R*S of its convolutions, and the Gemm's.
    return g.model(g.node("Gemm", [x, w, b], transB=1)), [27, 16, 72, 8, 16, 32, 72, 8, 32]


def mobilenet_style():
    """Conv + relu6 (Clip), depthwise + relu6, project + residual, SiLU
    (Sigmoid, Mul), a squeeze-excite gate, hardswish, hardsigmoid."""
    g = GraphBuilder([1, 3, 24, 24])
    zero, six = g.constant(np.float32(0)), g.constant(np.float32(6))
    x = g.node("Clip", [g.conv("input", 3, 16, 3, stride=2, bn=True), zero, six])
    y = g.node("Clip", [g.conv(x, 16, 16, 3, groups=16, bn=True), zero, six])
    y = g.conv(y, 16, 16, 1, bn=True)
    x = g.node("Add", [x, y])
    expanded = g.conv(x, 16, 32, 1)
    x = g.node("Mul", [expanded, g.node("Sigmoid", [expanded])])
    x = g.conv(x, 32, 32, 5, stride=2, groups=32)
    x = g.node("HardSwish", [x])
    gate = g.node("GlobalAveragePool", [x])
    gate = g.node("Relu", [g.conv(gate, 32, 8, 1)])
    gate = g.node("HardSigmoid", [g.conv(gate, 8, 32, 1)], alpha=1 / 6, beta=0.5)
    x = g.node("Mul", [x, gate])
    x = g.node("Sigmoid", [g.conv(x, 32, 24, 1)])
    return g.model(g.node("ReduceMean", [x], axes=[2, 3], keepdims=0)), [
        27,
        9,
        16,
        16,
        25,
        32,
        8,
        32,
    ]


def check_against_reference(model, lengths, feed):
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    session = cso.onnx.InferenceSession(model, threads=1)
    got = session.run(None, feed)[0]
    # Each layer's relative error is at most (L + 2) u of its magnitudes; layers compound.
    bound = 2 * np.finfo(np.float32).eps * sum(length + 2 for length in lengths)
    assert np.max(np.abs(got - expected)) <= bound * np.max(np.abs(expected))
    return session


def test_resnet_style_graph():
    model, lengths = resnet_style()
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    session = check_against_reference(model, lengths, {"input": x})
    steps = "\n".join(session.steps)
    assert steps.count("Conv node") == 8
    assert "(+ BatchNormalization + Add + Relu) -> relu" in steps
    assert "BatchNormalization node" not in steps and "Relu node" not in steps


def test_mobilenet_style_graph():
    model, lengths = mobilenet_style()
    x = rng.standard_normal((1, 3, 24, 24)).astype(np.float32)
    session = check_against_reference(model, lengths, {"input": x})
    steps = "\n".join(session.steps)
    for fused in ("-> relu6", "-> silu", "-> hardswish", "-> hardsigmoid", "-> sigmoid"):
        assert fused in steps, fused
    assert "Clip node" not in steps
    # The squeeze-excite gate's Mul is taken into the convolution after it.
    assert "Mul node" not in steps and "(+ Mul + Sigmoid) -> sigmoid" in steps


def test_squeeze_excite_gate_over_a_batch():
    """With several images the gate cannot be folded into one set of filters:
    the Mul runs apart, and the result is the same."""
    model, lengths = mobilenet_style()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    x = rng.standard_normal((3, 3, 24, 24)).astype(np.float32)
    check_against_reference(model, lengths, {"input": x})


def test_other_batch_sizes_and_threads():
    model, lengths = resnet_style()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    session = cso.onnx.InferenceSession(model, threads=cso.detect_hardware().cores)
    assert session.get_inputs()[0].shape == ["N", 3, 32, 32]
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    expected = ReferenceEvaluator(model).run(None, {"input": x})[0]
    got = session.run(["v" + session.get_outputs()[0].name[1:]], {"input": x})[0]
    assert got.shape == (3, 10)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_broadcast_residual_runs_unfused():
    g = GraphBuilder([1, 4, 6, 6])
    y = g.conv("input", 4, 4, 3)
    y = g.node("Relu", [g.node("Add", [y, g.constant(np.ones((4, 1, 1), np.float32))])])
    model = g.model(y)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    check_against_reference(model, [36], {"input": x})


def test_node_args_match_onnxruntime_conventions():
    model, _ = resnet_style()
    session = cso.onnx.InferenceSession(model)
    (arg,) = session.get_inputs()
    assert (arg.name, arg.shape, arg.type) == ("input", [1, 3, 32, 32], "tensor(float)")
    (out,) = session.get_outputs()
    assert out.shape == [1, 10] and out.type == "tensor(float)"


def test_loads_from_a_file_and_from_bytes(tmp_path):
    model, _ = resnet_style()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    a = cso.onnx.InferenceSession(str(path)).run(None, {"input": x})[0]
    b = cso.onnx.InferenceSession(path.read_bytes()).run(None, {"input": x})[0]
    np.testing.assert_array_equal(a, b)


# ---- bad models -------------------------------------------------------------


def test_missing_file_and_garbage(tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        cso.onnx.InferenceSession(tmp_path / "absent.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xffnot a model" * 10)
    with pytest.raises(ModelError, match="garbage.onnx"):
        cso.onnx.InferenceSession(garbage)
    with pytest.raises(TypeError, match="path_or_model"):
        cso.onnx.InferenceSession(42)
    with pytest.raises(ValueError, match="threads"):
        cso.onnx.InferenceSession(resnet_style()[0], threads=0)


def test_unsupported_operator_is_named():
    g = GraphBuilder([1, 2, 4, 4])
    y = g.node("LpNormalization", ["input"])
    with pytest.raises(ModelError, match="LpNormalization node 'LpNormalization_1'.*not supported"):
        cso.onnx.InferenceSession(g.model(y))


def test_missing_initializer_is_named():
    model, _ = resnet_style()
    del model.graph.initializer[0]
    with pytest.raises(ModelError, match="c0"):
        cso.onnx.InferenceSession(model)


def test_three_d_convolution_is_refused():
    g = GraphBuilder([1, 2, 4, 4, 4])
    w = g.constant(np.ones((3, 2, 1, 1, 1), np.float32))
    y = g.node("Conv", ["input", w], kernel_shape=[1, 1, 1])
    with pytest.raises(ModelError, match="Conv node 'Conv_1': only 2-D convolutions"):
        cso.onnx.InferenceSession(g.model(y))


# ---- bad inputs -------------------------------------------------------------


@pytest.fixture(scope="module")
def session():
    return cso.onnx.InferenceSession(resnet_style()[0], threads=1)


def test_wrong_input_shape_dtype_and_names(session):
    x = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(ValueError, match=r"input 'input' must have shape \(1, 3, 32, 32\)"):
        session.run(None, {"input": np.zeros((1, 3, 31, 32), np.float32)})
    with pytest.raises(ValueError, match="input 'input' must be float32"):
        session.run(None, {"input": x.astype(np.float64)})
    with pytest.raises(ValueError, match="input 'input' is missing"):
        session.run(None, {})
    with pytest.raises(ValueError, match="'image' is not an input"):
        session.run(None, {"input": x, "image": x})
    with pytest.raises(ValueError, match="'logits' is not an output"):
        session.run(["logits"], {"input": x})
    with pytest.raises(TypeError, match="input_feed must be a dict"):
        session.run(None, [x])
    with pytest.raises(TypeError, match="output_names"):
        session.run("logits", {"input": x})


# ---- packed state -------------------------------------------------------------


def test_saved_session_loads_back_and_runs_alike(tmp_path, session):
    path = tmp_path / "model.cso"
    session.save(path)
    loaded = cso.onnx.InferenceSession(path, threads=1)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(
        loaded.run(None, {"input": x})[0], session.run(None, {"input": x})[0]
    )
    # The eight convolutions and the Gemm, run as a 1x1 convolution.
    assert cso.load_packed(path).keys() == {f"conv{i}" for i in range(9)}


def _member_data_offset(data: bytes, member: str) -> tuple:
    """``(start, size)`` of a stored member's bytes in a zip archive, from its
    local header (whose extra field may differ from the central directory's)."""
    import io
    import struct
    import zipfile

    info = zipfile.ZipFile(io.BytesIO(data)).getinfo(member)
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    return info.header_offset + 30 + name_length + extra_length, info.compress_size


@pytest.mark.parametrize("member", ["__model__.npy", "conv0/panels.npy"])
def test_damaged_saved_session_is_refused(tmp_path, session, member):
    # A byte flipped in the saved model or in a layer's panels, past its .npy
    # header (a byte of a zip header field the reader ignores leaves the data
    # whole, and the file then loads as saved).
    path = tmp_path / "model.cso"
    session.save(path)
    data = bytearray(path.read_bytes())
    start, size = _member_data_offset(bytes(data), member)
    data[start + size // 2] ^= 0xFF
    damaged = tmp_path / "damaged.cso"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="damaged.cso"):
        cso.onnx.InferenceSession(damaged)


def test_a_session_file_of_filters_only_is_refused(tmp_path, session):
    path = tmp_path / "model.cso"
    session.save(path)
    filters_only = tmp_path / "filters.npz"
    cso.save_packed(filters_only, {"conv0": cso.load_packed(path)["conv0"]})
    with pytest.raises(ModelError, match="no model"):
        cso.onnx.InferenceSession(filters_only)


def test_saved_layers_must_match_the_model(tmp_path, session):
    from cso.packed_file import load_packed_model

    path = tmp_path / "model.cso"
    layers, model = load_packed_model(session_file(session, tmp_path))
    layers["conv0"], layers["conv1"] = layers["conv1"], layers["conv0"]
    cso.save_packed(path, layers, model=model)
    with pytest.raises(ModelError, match="saved layer 'conv0' is not the convolution of Conv"):
        cso.onnx.InferenceSession(path)


def session_file(session, tmp_path):
    path = tmp_path / "original.cso"
    session.save(path)
    return path


def test_prepack_cli_packs_an_onnx_model(tmp_path, capsys):
    from cso.prepack import main

    model = tmp_path / "model.onnx"
    onnx.save(resnet_style()[0], str(model))
    assert main([str(model), "-o", str(tmp_path / "model.cso"), "--threads", "1"]) == 0
    assert "packed 9 layers" in capsys.readouterr().out
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    a = cso.onnx.InferenceSession(tmp_path / "model.cso").run(None, {"input": x})[0]
    # One thread, as packed: the same plans, so the same bits.
    b = cso.onnx.InferenceSession(model, threads=1).run(None, {"input": x})[0]
    np.testing.assert_array_equal(a, b)
    assert main([str(model), "--spec", "s.json", "-o", str(tmp_path / "x.cso")]) == 1
    assert main([str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "x.cso")]) == 1
    assert "no such file" in capsys.readouterr().err
