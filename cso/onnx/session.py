"""``InferenceSession``: an ONNX model run by cso, with onnxruntime's interface.

Made once per model: the model is read and checked (:mod:`.graph`), each
``Conv`` takes in the batch normalization, residual ``Add`` and activation
after it (:mod:`.fusion`), and every convolution's filters are packed for
the model's input shape (:mod:`.convolution`).  ``run`` checks the inputs
against the model's before any work, then runs the steps in order, dropping
each value after its last reader.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import numpy as np

from ..checks import check_threads
from ..executor import available_threads
from ..packed_file import PackedFormatError, load_packed_model, save_packed
from .convolution import ConvStep, run_node
from .fusion import FusedConv, fuse
from .graph import ModelError, fold_constants, load_model, read_graph


class NodeArg(NamedTuple):
    """A model input or output as onnxruntime describes it: ``shape`` has an
    int per fixed axis and a name (or None) per symbolic one; ``type`` is
    e.g. ``"tensor(float)"``."""

    name: str
    shape: list
    type: str


class StepTime(NamedTuple):
    """One step of a session's run, timed (:meth:`InferenceSession.profile`):
    its description (as in ``steps``), ``op_type`` (``"Conv"`` for a fused
    convolution, a Gemm or MatMul run as one included), best ``seconds``, the
    step's packed filters (None for other operators) and the values it writes
    (a fused convolution's: the convolution's own output, then the last
    absorbed node's)."""

    description: str
    op_type: str
    seconds: float
    packed: object
    outputs: tuple


class InferenceSession:
    """Run an ONNX model with cso's convolutions.

    Parameters
    ----------
    path_or_model : str, os.PathLike, bytes or onnx.ModelProto
        The model: a file, its serialized bytes, or a loaded model.
    threads : int, optional
        Workers for the convolutions (default: all cores).

    Raises
    ------
    ModelError
        When the model cannot be read or run (an unsupported operator, an
        input no node computes...), naming the node or value.

    Examples
    --------
    >>> session = cso.onnx.InferenceSession("resnet50.onnx")  # doctest: +SKIP
    >>> name = session.get_inputs()[0].name                   # doctest: +SKIP
    >>> logits, = session.run(None, {name: images})            # doctest: +SKIP
    """

    def __init__(self, path_or_model, threads=None):
        self.threads = check_threads(threads, available_threads())
        saved_layers = {}
        if _is_packed_state(path_or_model):
            saved_layers, path_or_model = _load_state(path_or_model)
        model = load_model(path_or_model)
        self._model = model  # serialized only if the session is saved
        graph = read_graph(model)
        fold_constants(graph, run_node)
        self._graph = graph
        self._inputs = graph.inputs
        self._outputs = graph.outputs
        self._steps = []
        for step in fuse(graph):
            if isinstance(step, FusedConv):
                conv = ConvStep(step, self.threads)
                name = f"conv{sum(isinstance(s, ConvStep) for s in self._steps)}"
                if name in saved_layers:
                    try:
                        conv.adopt(saved_layers.pop(name), name)
                    except PackedFormatError as error:
                        raise ModelError(f"path_or_model: {error}") from None
                else:
                    _prepare(conv, graph)
                self._steps.append(conv)
            else:
                self._steps.append(step)
        if saved_layers:
            raise ModelError(
                f"path_or_model: saved layers {sorted(saved_layers)} match no convolution"
            )
        self._releases = _last_reads(self._steps, graph)

    def save(self, path) -> None:
        """Write the model and every convolution's packed filters to ``path``
        (the packed-filters format of :func:`cso.save_packed`, with the model
        inside): ``InferenceSession(path)`` then skips the packing.  From the
        shell: ``cso-prepack model.onnx -o model.cso``."""
        layers = self.packed_layers()
        if not layers:
            raise ValueError("the model has no convolution with constant filters to save")
        save_packed(path, layers, model=self.model_bytes())

    def model_bytes(self) -> bytes:
        """The model, serialized: what a session on another process is made from
        (:func:`cso.dask.run` ships it to each worker once)."""
        return self._model.SerializeToString()

    def packed_layers(self) -> dict:
        """``{"conv<i>": PackedFilters}``: the packed filters of the i-th fused
        convolution (or matrix product), for those packed so far."""
        layers = {}
        for index, step in enumerate(s for s in self._steps if isinstance(s, ConvStep)):
            packed = step.packed_filters()
            if packed is not None:
                layers[f"conv{index}"] = packed
        return layers

    def get_inputs(self) -> list:
        """The model's inputs, as :class:`NodeArg`."""
        return [_node_arg(value) for value in self._inputs]

    def get_outputs(self) -> list:
        """The model's outputs, as :class:`NodeArg`."""
        return [_node_arg(value) for value in self._outputs]

    @property
    def steps(self) -> list:
        """What ``run`` does, one line per step: each fused convolution with
        the nodes it took in, and the other operators."""
        return [
            step.step.describe() + (f" -> {step.step.activation}" if step.step.activation else "")
            if isinstance(step, ConvStep)
            else step.describe()
            for step in self._steps
        ]

    def run(self, output_names, input_feed, run_options=None) -> list:
        """Compute ``output_names`` (None: every output) from ``input_feed``,
        a dict from input name to array.

        Raises
        ------
        TypeError, ValueError
            Before any work, naming the input or output that is wrong.
        """
        if run_options is not None:
            raise ValueError("run_options is not supported by cso; pass None")
        names = self._output_names(output_names)
        values = self._execute(self._check_feed(input_feed))
        return [values[name] for name in names]

    def profile(self, input_feed, rounds=1) -> list:
        """Run the model ``rounds`` times, as :meth:`run` does, timing each step:
        a :class:`StepTime` per step (in order), with its best time."""
        feed = self._check_feed(input_feed)
        best = [float("inf")] * len(self._steps)

        def timed(index, started):
            best[index] = min(best[index], time.perf_counter() - started)

        for _ in range(rounds):
            self._execute(feed, timed)
        descriptions = self.steps
        return [
            StepTime(
                description,
                "Conv" if isinstance(step, ConvStep) else step.op_type,
                seconds,
                step.packed_filters() if isinstance(step, ConvStep) else None,
                (step.step.node.outputs[0], step.step.output)
                if isinstance(step, ConvStep)
                else tuple(step.outputs),
            )
            for step, description, seconds in zip(self._steps, descriptions, best)
        ]

    def _execute(self, feed, timed=None) -> dict:
        """Every step on ``feed`` (checked): the values left (the outputs
        among them); ``timed(index, start)`` after each step, if given."""
        values = dict(self._graph.constants)
        values.update(feed)
        for index, (step, releases) in enumerate(zip(self._steps, self._releases)):
            started = time.perf_counter() if timed is not None else 0.0
            if isinstance(step, ConvStep):
                step.run(values)
            else:
                run_node(step, values)
            if timed is not None:
                timed(index, started)
            for name in releases:
                values.pop(name, None)
        return values

    def _output_names(self, output_names) -> list:
        known = [value.name for value in self._outputs]
        if output_names is None:
            return known
        if isinstance(output_names, str) or not all(isinstance(n, str) for n in output_names):
            raise TypeError("output_names must be None or a list of output names")
        for name in output_names:
            if name not in known:
                raise ValueError(f"output_names: {name!r} is not an output of the model ({known})")
        return list(output_names)

    def _check_feed(self, input_feed) -> dict:
        if not isinstance(input_feed, dict):
            raise TypeError(
                f"input_feed must be a dict of name: array, got {type(input_feed).__name__}"
            )
        expected = {value.name: value for value in self._inputs}
        for name in input_feed:
            if name not in expected:
                raise ValueError(
                    f"input_feed: {name!r} is not an input of the model ({list(expected)})"
                )
        feed = {}
        for name, value in expected.items():
            if name not in input_feed:
                raise ValueError(f"input_feed: input {name!r} is missing")
            array = input_feed[name]
            if not isinstance(array, np.ndarray):
                array = np.asarray(array)
            if array.dtype != value.dtype:
                raise ValueError(
                    f"input {name!r} must be {value.dtype} ({value.type_name}), got {array.dtype}"
                )
            if value.shape is not None:
                if array.ndim != len(value.shape) or any(
                    isinstance(d, int) and d != s for d, s in zip(value.shape, array.shape)
                ):
                    raise ValueError(
                        f"input {name!r} must have shape {_shape_text(value.shape)}, "
                        f"got {array.shape}"
                    )
            feed[name] = array
        return feed


def _is_packed_state(path_or_model) -> bool:
    """Whether ``path_or_model`` names a saved session (an ``.npz``, so a zip
    file) rather than an ONNX model."""
    if not isinstance(path_or_model, (str, os.PathLike)):
        return False
    try:
        with open(path_or_model, "rb") as handle:
            return handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False  # load_model names the problem


def _load_state(path):
    """``(layers, model bytes)`` of a saved session, validated as packed filters are."""
    try:
        layers, model = load_packed_model(path)
    except PackedFormatError as error:
        raise ModelError(f"path_or_model: {error}") from None
    if model is None:
        raise ModelError(
            f"path_or_model: {os.fspath(path)!r} holds packed filters but no model "
            "(read it with cso.load_packed)"
        )
    return layers, model


def _prepare(conv: ConvStep, graph) -> None:
    """Pack ``conv``'s filters for the input shape shape inference gave, if
    every axis but the batch is known (the batch taken as 1 when symbolic)."""
    name = conv.step.input
    shape = graph.shapes.get(name)
    if conv.step.matrix:
        if shape is None or len(shape) != 2:
            return  # vectors along the last axis of more axes: packed on first use
        shape = tuple(shape) + (1, 1)  # (N, K) as N images of K channels and 1x1 pixels
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        return
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
    source = next((v for v in graph.inputs if v.name == name), None)
    dtype = source.dtype if source is not None else conv.step.weights.dtype
    conv.prepare((batch,) + tuple(shape[1:]), dtype)


def _last_reads(steps, graph) -> list:
    """For each step, the values no later step reads (and no output is): dropped after it."""
    keep = {value.name for value in graph.outputs} | set(graph.constants)
    last = {}
    for index, step in enumerate(steps):
        node_inputs = _reads(step)
        for name in node_inputs:
            last[name] = index
    releases = [[] for _ in steps]
    for name, index in last.items():
        if name and name not in keep:
            releases[index].append(name)
    return releases


def _reads(step) -> list:
    return step.step.reads() if isinstance(step, ConvStep) else list(step.inputs)


def _node_arg(value) -> NodeArg:
    shape = None if value.shape is None else list(value.shape)
    return NodeArg(value.name, shape, value.type_name)


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(d) if d is not None else "?" for d in shape) + ")"


__all__ = ["InferenceSession", "NodeArg", "ModelError"]
