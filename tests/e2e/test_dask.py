"""cso.dask: every chunking against cso.conv2d on the whole array (dask's
threaded scheduler), and on a two-process LocalCluster a rechunked input and
a model over a batch against the session on one machine."""

import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
onnx = pytest.importorskip("onnx")

import cso  # noqa: E402
import cso.dask  # noqa: E402
import cso.onnx  # noqa: E402


@pytest.fixture(scope="module")
def client():
    """Two worker processes of one thread each, closed after the module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dashboard's port, and the like
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


rng = np.random.default_rng(21)
X = rng.standard_normal((3, 6, 23, 19)).astype(np.float32)
W = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
B = rng.standard_normal(8).astype(np.float32)

CHUNKINGS = [
    (3, 6, 23, 19),
    (1, 6, 23, 19),
    (3, 6, 8, 19),
    (3, 6, 23, 5),
    (2, 6, 4, 7),
    (1, 6, 1, 3),
]
PARAMETERS = [
    dict(padding=1, groups=2),
    dict(stride=2, padding=((0, 2), (1, 0)), groups=2, activation="silu"),
    dict(stride=3, dilation=2, padding=3, groups=2, activation="relu"),
    dict(padding="same", dilation=2, groups=2, activation="hardswish"),
    dict(stride=(1, 2), padding=((2, 1), (0, 0)), groups=1),
]


@pytest.mark.parametrize("parameters", PARAMETERS, ids=lambda p: str(sorted(p.items())))
def test_every_chunking_matches_the_whole_array(parameters):
    # Dask's threaded scheduler, in this process: the halos and plans are the
    # same as on a cluster, and each block shape's kernels are compiled once,
    # not once in each worker process (this test took 5 of the suite's 16
    # cold minutes on the process cluster).  The cluster's own path, filters
    # shipped to worker processes, is the tests below that take `client`.
    weights = (
        W
        if parameters.get("groups", 1) == 2
        else rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    )
    expected = cso.conv2d(X, weights, B, **parameters)
    for chunks in CHUNKINGS:
        x = da.from_array(X, chunks=chunks)
        y = cso.dask.conv2d(x, weights, B, **parameters)
        assert y.shape == expected.shape and y.dtype == expected.dtype
        assert y.chunks[0] == x.chunks[0]
        result = y.compute(scheduler="threads")
        # Blocks are planned for their own shapes: sums in another order.
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4), chunks


def test_split_channels_are_rechunked_with_a_warning(client):
    x = da.from_array(X, chunks=(3, 2, 23, 19))
    with pytest.warns(UserWarning, match="rechunking them into one"):
        y = cso.dask.conv2d(x, W, groups=2)
    np.testing.assert_allclose(y.compute(), cso.conv2d(X, W, groups=2), rtol=1e-5, atol=1e-4)


def test_filters_are_packed_once_per_block_shape():
    x = da.from_array(np.zeros((4, 6, 40, 40), np.float32), chunks=(1, 6, 10, 10))
    y = cso.dask.conv2d(x, W, padding=1, groups=2)
    graph = dict(y.__dask_graph__())
    packed = [key for key in graph if str(key).startswith("cso-packed-")]
    assert len(packed) == 1  # one graph value: each worker receives it once
    value = graph[packed[0]]
    value = getattr(value, "value", value)  # newer dask wraps graph data in a DataNode
    assert len(value) == 9  # corners, edges and inside: 3 x 3 block kinds


def test_two_chunkings_of_the_same_filters_run_in_one_graph():
    # Their packs differ, so they must be two graph values, not one name holding either.
    import dask

    weights = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    coarse = cso.dask.conv2d(da.from_array(X, chunks=(3, 6, 8, 19)), weights, padding=1)
    fine = cso.dask.conv2d(da.from_array(X, chunks=(1, 6, 1, 3)), weights, padding=1)
    strided = cso.dask.conv2d(da.from_array(X, chunks=(1, 6, 1, 3)), weights, stride=2)
    results = dask.compute(coarse, fine, strided, scheduler="sync")
    for result, parameters in zip(results, [dict(padding=1), dict(padding=1), dict(stride=2)]):
        expected = cso.conv2d(X, weights, **parameters)
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)


def test_bad_input_is_refused_before_any_task():
    x = da.from_array(X, chunks=(1, 6, 8, 8))
    with pytest.raises(TypeError, match="x must be a dask.array.Array"):
        cso.dask.conv2d(X, W, groups=2)
    with pytest.raises(ValueError, match="x must be 4-D"):
        cso.dask.conv2d(x[0], W, groups=2)
    with pytest.raises(ValueError, match="groups"):
        cso.dask.conv2d(x, W, groups=4)
    with pytest.raises(ValueError, match="activation"):
        cso.dask.conv2d(x, W, groups=2, activation="tanh")
    with pytest.raises(ValueError, match="stride 1"):
        cso.dask.conv2d(x, W, groups=2, padding="same", stride=2)


def small_model():
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_over_a_batch_matches_one_session(client, tmp_path):
    session = cso.onnx.InferenceSession(small_model(), threads=1)
    images = rng.standard_normal((7, 3, 12, 12)).astype(np.float32)
    expected = session.run(None, {"x": images})[0]
    x = da.from_array(images, chunks=(3, 3, 12, 12))
    result = cso.dask.run(session, x, threads=1)
    assert result.chunks[0] == (3, 3, 1)
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-6, atol=1e-6)
    path = tmp_path / "model.cso"
    session.save(path)
    np.testing.assert_allclose(
        cso.dask.run(str(path), x, threads=1).compute(), expected, rtol=1e-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="chunked along the batch only"):
        cso.dask.run(session, da.from_array(images, chunks=(3, 3, 6, 12)))
