"""Input packing: windows of the (zero-padded) input into input panels.

Packed-layout contract
----------------------
The input is first copied once into ``x_padded[N][C][Hp][Wp]`` with the
convolution's padding as explicit zeros (:func:`pad_input`), so that no
packing loop tests for borders.  An input panel for channels
``[c0, c0 + nc)`` and windows ``[w0, w0 + Nwin)`` of image ``n`` is
``[nc*R*S][Nwin]``::

    panel[(c*R + r)*S + s][j] = x_padded[n][c0 + c][p*sh + r*dh][q*sw + s*dw]

with ``w0 + j = p*Q + q``.  Columns for windows past ``P*Q`` are zero, so the
micro-kernel always sees a full tile.  A tile may span several output rows;
it is packed one output-row run at a time.

Two strategies fill a run of windows on one output row:

* stride 1 (:func:`pack_input_panel_shifted`, vector-based packing): the
  ``S`` panel rows of one ``(c, r)`` are the same input row segment shifted
  by ``s*dw`` elements; each is one masked vector copy
  (:func:`~cso.packing.vector_copy.copy_run`) starting ``s*dw`` further, so
  the segment is read from memory once and its shifted copies come from L1;
* any other stride (:func:`pack_input_panel_gather`): each panel row is one
  masked vector gather (:func:`~cso.packing.vector_copy.gather_run`) of the
  elements at ``q*sw + s*dw``.

A 1x1, stride-1, unpadded convolution needs no input panel at all: its
panel is the input itself with row stride ``H*W`` (see the loop nests).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .vector_copy import copy_run, gather_run


def pad_input(x: np.ndarray, pad_top: int, pad_bottom: int, pad_left: int, pad_right: int,
              dtype) -> np.ndarray:
    """``x`` as a C-contiguous ``dtype`` array with explicit zero borders."""
    if not (pad_top or pad_bottom or pad_left or pad_right):
        return np.ascontiguousarray(x, dtype=dtype)
    batch, channels, height, width = x.shape
    padded = np.zeros((batch, channels, height + pad_top + pad_bottom,
                       width + pad_left + pad_right), dtype=dtype)
    padded[:, :, pad_top:pad_top + height, pad_left:pad_left + width] = x
    return padded


@njit(cache=True, nogil=True)
def _zero_tail(panel, panel_offset, depth, windows_per_tile, first_column):
    # Windows past P*Q: zero columns, so the kernel's extra outputs are harmless.
    for k in range(depth):
        row = panel_offset + k * windows_per_tile
        for j in range(first_column, windows_per_tile):
            panel[row + j] = 0.0


@njit(cache=True, nogil=True)
def pack_input_panel_shifted(x_flat, image_offset, height_padded, width_padded, channel_start,
                             channels, kernel_height, kernel_width, dilation_h, dilation_w,
                             out_width, windows, window_start, windows_per_tile,
                             panel, panel_offset):
    """Stride-1 input panel by shifted vector copies (VBP); see the module contract."""
    depth = channels * kernel_height * kernel_width
    column = 0
    while column < windows_per_tile:
        window = window_start + column
        if window >= windows:
            _zero_tail(panel, panel_offset, depth, windows_per_tile, column)
            return
        p = window // out_width
        q = window - p * out_width
        run = min(windows_per_tile - column, out_width - q)
        for c in range(channels):
            plane = image_offset + (channel_start + c) * height_padded * width_padded
            for r in range(kernel_height):
                source = plane + (p + r * dilation_h) * width_padded + q
                row = panel_offset + (c * kernel_height + r) * kernel_width * windows_per_tile + column
                for s in range(kernel_width):
                    copy_run(panel, row + s * windows_per_tile, x_flat, source + s * dilation_w, run)
        column += run


@njit(cache=True, nogil=True)
def pack_input_panel_gather(x_flat, image_offset, height_padded, width_padded, channel_start,
                            channels, kernel_height, kernel_width, stride_h, stride_w,
                            dilation_h, dilation_w, out_width, windows, window_start,
                            windows_per_tile, panel, panel_offset):
    """Input panel for any stride, one gathered element at a time."""
    depth = channels * kernel_height * kernel_width
    column = 0
    while column < windows_per_tile:
        window = window_start + column
        if window >= windows:
            _zero_tail(panel, panel_offset, depth, windows_per_tile, column)
            return
        p = window // out_width
        q = window - p * out_width
        run = min(windows_per_tile - column, out_width - q)
        for c in range(channels):
            plane = image_offset + (channel_start + c) * height_padded * width_padded
            for r in range(kernel_height):
                source_row = plane + (p * stride_h + r * dilation_h) * width_padded + q * stride_w
                row = panel_offset + (c * kernel_height + r) * kernel_width * windows_per_tile + column
                for s in range(kernel_width):
                    gather_run(panel, row + s * windows_per_tile, x_flat,
                               source_row + s * dilation_w, run, stride_w)
        column += run
