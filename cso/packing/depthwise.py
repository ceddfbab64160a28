"""Packing one input channel for the depthwise tap kernel.

Packed-layout contract (what :mod:`cso.microkernels.taps` reads)
---------------------------------------------------------------
One channel of one image becomes ``stride_w`` *phases*, each ``rows`` rows of
``phase_width`` elements::

    buffer[(phase * rows + row) * phase_width + j]
        = x[row - pad_top][j * stride_w + phase - pad_left]   (zero outside x)

With this layout the input column of output ``q``'s tap ``s``,
``q * stride_w + s * dilation_w``, is element ``q + (s * dilation_w) //
stride_w`` of phase ``(s * dilation_w) % stride_w``: every tap of every
stride and dilation reads a contiguous run, so the kernel loads whole
vectors.  Rows past the input and columns past its edges are zeros, and
``phase_width`` covers every load of the last, padded row segment.

With ``stride_w == 1`` there is one phase, the input's rows at their
padded place: :func:`pack_channel_rows` then copies only those rows (a
masked vector copy each) and leaves the padding as the buffer holds it,
which the caller must have zeroed (the tap nest does so once a call; every
job writes the same inside).
"""

from __future__ import annotations

from numba import njit

from .vector_copy import pack_row_runs


# Not cached on its own: it is compiled into, and cached with, each
# specialised depthwise module, whose file name hashes this source.
@njit(nogil=True)
def pack_channel_phases(
    x_flat, plane_offset, height, width, pad_top, pad_left, stride_w, rows, phase_width,
    buffer, buffer_offset, vector,
):  # fmt: skip
    """Write the phases of the channel plane at ``x_flat[plane_offset:]``
    (``height x width``) into ``buffer[buffer_offset:]`` (see the module contract)."""
    phase_stride = rows * phase_width
    # Three calls, not one per row: the rows above the input, the input's
    # rows, the rows below, each a run of rows taken as pack_row_runs'
    # "channels" (row after row, phase_width apart in the buffer and width
    # apart in x).  Row `row` of every phase in one go: copy `phase` starts
    # `phase` columns further on, each reading every stride_w-th column.
    first = min(max(pad_top, 0), rows)
    last = min(max(pad_top + height, first), rows)
    for start, stop, inside in ((0, first, False), (first, last, True), (last, rows, False)):
        if stop > start:
            pack_row_runs(
                buffer,
                buffer_offset + start * phase_width,
                phase_stride,
                x_flat,
                plane_offset + (start - pad_top) * width if inside else 0,
                -pad_left,
                stride_w,
                1,
                stride_w,
                phase_width,
                phase_width,
                0,
                width if inside else 0,
                stop - start,
                phase_width,
                width if inside else 0,
                vector,
            )


@njit(nogil=True)
def pack_channel_rows(
    x_flat, plane_offset, height, width, pad_top, pad_left, rows, phase_width,
    buffer, buffer_offset, vector,
):  # fmt: skip
    """The inside of :func:`pack_channel_phases` for ``stride_w == 1``: the
    rows holding the channel plane at ``x_flat[plane_offset:]``, each up to
    the vector that holds its last input column, written as that packing
    writes them (whole vectors from each row's start, so that every store
    is aligned; zeros for the left padding).  The rows above and below the
    input and the vectors past its right edge are left as the buffer holds
    them: zeros the caller wrote.  A 14-wide plane's channel, 512 elements
    written whole, took about 190 cycles on a Xeon; here 14 rows of one
    vector each."""
    lanes = len(vector)
    first = min(max(pad_top, 0), rows)
    last = min(max(pad_top + height, first), rows)
    count = min(phase_width, (pad_left + width + lanes - 1) // lanes * lanes)
    if last > first:
        pack_row_runs(
            buffer,
            buffer_offset + first * phase_width,
            phase_width,
            x_flat,
            plane_offset + (first - pad_top) * width,
            -pad_left,
            1,
            1,
            1,
            count,
            count,
            0,
            width,
            last - first,
            phase_width,
            width,
            vector,
        )
