"""Convolutions and models over Dask arrays: ``cso.dask.conv2d`` and ``cso.dask.run``.

Needs ``dask[array]`` (and ``distributed`` for a cluster): ``pip install "cso[dask]"``.

How an image chunked along its height and width is convolved
-------------------------------------------------------------
Each output row ``p`` is *owned* by the input chunk holding the first row
its window reads, ``p * stride - pad_top`` (clamped into the image), so every
output row is computed exactly once, whatever the chunks and the stride;
the same goes for columns.  The block of output rows ``[p0, p1)`` reads the
input rows ``[p0 * stride - pad_top, (p1 - 1) * stride - pad_top +
dilation * (R - 1)]``: its chunk and a halo of ``dilation * (R - 1)`` rows
past it, cut from the neighbouring chunks.  Only rows outside the image are
padding, so padding exists only at the image's true edges.  Batch chunks
map one to one; the channels must be one chunk (they are made so).

The filters are packed once on the client, for each distinct block shape
and edge padding (a handful: corners, edges, inside), and those packed
filters are one value of the task graph, which the scheduler sends to each
worker once.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

from .analysis.choices import activation_code
from .checks import as_array, check_bias, check_ndim, check_threads
from .conv import conv2d as _conv2d_numpy
from .executor import available_threads
from .geometry import make_geometry, result_dtype
from .packed import pack_filters


def _require_dask():
    try:
        import dask.array as da
    except ImportError:
        raise ImportError('cso.dask needs dask: pip install "cso[dask]"') from None
    return da


def _owned_blocks(chunks, extent, out_extent, stride, pad_before):
    """Output index ranges ``[(start, stop), ...]`` owned by the input chunks
    (see the module docstring), empty ones dropped."""
    bounds = np.array(list(itertools.accumulate(chunks, initial=0)))
    firsts = np.clip(np.arange(out_extent) * stride - pad_before, 0, extent - 1)
    owners = np.searchsorted(bounds, firsts, side="right") - 1
    counts = np.bincount(owners, minlength=len(chunks))
    stops = np.cumsum(counts[counts > 0])
    return [(int(stop - count), int(stop)) for stop, count in zip(stops, counts[counts > 0])]


def _input_window(block, stride, pad_before, dilation, kernel, extent):
    """``(first, stop, pad_before, pad_after)``: the input rows a block of output
    rows reads, clipped to the image, and the zeros past its true edges."""
    start, stop = block
    first = start * stride - pad_before
    last = (stop - 1) * stride - pad_before + dilation * (kernel - 1)
    return max(first, 0), min(last, extent - 1) + 1, max(-first, 0), max(last - (extent - 1), 0)


def _convolve_block(x_block, packed, activation):
    return _conv2d_numpy(np.ascontiguousarray(x_block), packed, activation=activation)


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, activation=None,
           threads=None):  # fmt: skip
    """:func:`cso.conv2d` of a lazy ``dask.array.Array`` ``x`` (NCHW).

    Parameters
    ----------
    x : dask.array.Array, shape (N, C, H, W)
        Chunked along any of N, H and W; channels are rechunked into one
        chunk if they are split.
    w, bias, stride, padding, dilation, groups, activation
        As for :func:`cso.conv2d` (``w`` and ``bias`` are NumPy arrays).
    threads : int, optional
        Threads each task's convolution runs on (default: all cores of its worker).

    Returns
    -------
    dask.array.Array
        ``(N, K, P, Q)``, lazy: chunks follow ``x``'s batch chunks and the
        output rows and columns each input chunk owns.

    Raises
    ------
    TypeError, ValueError
        Before any task is made, naming the parameter.
    """
    da = _require_dask()
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask.array.Array, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W), got {x.ndim}-D shape {x.shape}")
    if any(np.isnan(extent) for extent in x.shape):
        raise ValueError(f"x must have a known shape, got {x.shape}: call x.compute_chunk_sizes()")
    if np.dtype(x.dtype).kind not in "fiu":
        raise TypeError(f"x must have a real numeric dtype, got {x.dtype}")
    w = as_array(w, "w")
    check_ndim(w, "w", "(K, C // groups, R, S)")
    geometry = make_geometry(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    bias = check_bias(bias, geometry.filters)
    dtype = result_dtype(np.dtype(x.dtype), w.dtype)
    activation_code(activation)  # checked here, not in every task
    if threads is not None:
        check_threads(threads, available_threads())
    if len(x.chunks[1]) > 1:
        warnings.warn(
            f"cso.dask.conv2d: x's channels are split into {len(x.chunks[1])} chunks; "
            "rechunking them into one (each convolution reads every channel of its group)",
            stacklevel=2,
        )
        x = x.rechunk({1: -1})
    g = geometry
    row_blocks = _owned_blocks(x.chunks[2], g.height, g.out_height, g.stride_h, g.pad_top)
    column_blocks = _owned_blocks(x.chunks[3], g.width, g.out_width, g.stride_w, g.pad_left)
    rows = [_input_window(b, g.stride_h, g.pad_top, g.dilation_h, g.kernel_height, g.height)
            for b in row_blocks]  # fmt: skip
    columns = [_input_window(b, g.stride_w, g.pad_left, g.dilation_w, g.kernel_width, g.width)
               for b in column_blocks]  # fmt: skip
    batches = list(itertools.accumulate(x.chunks[0], initial=0))
    # The filters packed once per distinct block: input shape and edge padding.
    packs = {}
    for (n0, n1), (r0, r1, top, bottom), (c0, c1, left, right) in itertools.product(
        zip(batches, batches[1:]), rows, columns
    ):
        key = (n1 - n0, r1 - r0, c1 - c0, top, bottom, left, right)
        if key not in packs:
            packs[key] = pack_filters(
                w.astype(dtype, copy=False), (n1 - n0, g.channels, r1 - r0, c1 - c0),
                stride=(g.stride_h, g.stride_w), padding=((top, bottom), (left, right)),
                dilation=(g.dilation_h, g.dilation_w), groups=groups, bias=bias,
                dtype=dtype, threads=threads,
            )  # fmt: skip
    import dask

    # The name must cover everything the packs depend on: two calls with the same
    # filters but other chunks or parameters hold other packs under other keys.
    token = dask.base.tokenize(
        w, bias, str(dtype), sorted(packs), g.channels, (g.stride_h, g.stride_w),
        (g.dilation_h, g.dilation_w), groups, threads,
    )  # fmt: skip
    packed_all = dask.delayed(packs, pure=True, name=f"cso-packed-{token}")
    x = x.astype(dtype) if np.dtype(x.dtype) != dtype else x
    grid = []
    for n0, n1 in zip(batches, batches[1:]):
        plane = []
        for (p0, p1), (r0, r1, top, bottom) in zip(row_blocks, rows):
            line = []
            for (q0, q1), (c0, c1, left, right) in zip(column_blocks, columns):
                key = (n1 - n0, r1 - r0, c1 - c0, top, bottom, left, right)
                task = dask.delayed(_convolve_block, pure=True)(
                    x[n0:n1, :, r0:r1, c0:c1], packed_all[key], activation
                )
                line.append(
                    da.from_delayed(task, (n1 - n0, g.filters, p1 - p0, q1 - q0), dtype=dtype)
                )
            plane.append(line)
        grid.append([plane])
    return da.block(grid)


def run(session, x, threads=None):
    """Run a model over a batch of images held as a Dask array, chunk by chunk.

    Parameters
    ----------
    session : cso.onnx.InferenceSession, or a path to an ONNX model or a
        saved session (``.cso``)
        The model; each worker process makes its own session of it, once.
    x : dask.array.Array
        The model's (single) input, chunked along the batch only.
    threads : int, optional
        Threads of each worker's session (default: all its cores).

    Returns
    -------
    dask.array.Array
        The model's first output, chunked along the batch as ``x``.
    """
    da = _require_dask()
    from .onnx import InferenceSession

    if not isinstance(session, InferenceSession):
        session = InferenceSession(session, threads=threads)  # a model or a saved session
    # Workers get the model's bytes, once each, and make their own session of it.
    model = session.model_bytes()
    if not isinstance(x, da.Array):
        raise TypeError(f"x must be a dask.array.Array, got {type(x).__name__}")
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ValueError(f"cso.dask.run needs a model of one input, this one has {len(inputs)}")
    (model_input,) = inputs
    expected = model_input.shape
    if x.ndim != len(expected) or any(
        isinstance(d, int) and d != s for d, s in zip(expected[1:], x.shape[1:])
    ):
        raise ValueError(f"x must have the model's input shape {expected}, got {x.shape}")
    if any(len(chunks) > 1 for chunks in x.chunks[1:]):
        raise ValueError(
            f"x must be chunked along the batch only, got chunks {x.chunks}: "
            "rechunk with x.rechunk({axis: -1 for axis in range(1, x.ndim)})"
        )
    # The output's shape beyond the batch, from one image run here.
    probe = session.run(None, {model_input.name: np.zeros((1,) + x.shape[1:], x.dtype)})[0]
    import dask

    token = dask.base.tokenize(model)
    model_value = dask.delayed(model, pure=True, name=f"cso-model-{token}")
    blocks = []
    bounds = list(itertools.accumulate(x.chunks[0], initial=0))
    for start, stop in zip(bounds, bounds[1:]):
        task = dask.delayed(_run_block, pure=True)(
            model_value, token, x[start:stop], model_input.name, threads
        )
        blocks.append(da.from_delayed(task, (stop - start,) + probe.shape[1:], dtype=probe.dtype))
    return da.concatenate(blocks, axis=0)


_worker_sessions: dict = {}


def _run_block(model, token, images, input_name, threads):
    """One batch chunk through this process's session of the model (made once)."""
    # Keyed by the thread count too: a session runs on the threads it was made with.
    session = _worker_sessions.get((token, threads))
    if session is None:
        from .onnx import InferenceSession

        session = _worker_sessions[token, threads] = InferenceSession(model, threads=threads)
    return session.run(None, {input_name: np.ascontiguousarray(images)})[0]
