"""Input packing: windows of the input into input panels, zeros for padding.

Packed-layout contract
----------------------
An input panel for channels ``[c0, c0 + nc)`` and windows ``[w0, w0 + Nwin)``
of image ``n`` is ``[nc*R*S][Nwin]``::

    panel[(c*R + r)*S + s][j] = x[n][c0 + c][p*sh + r*dh - pad_top][q*sw + s*dw - pad_left]

with ``w0 + j = p*Q + q``, and zero where that index falls in the padding
or ``w0 + j >= P*Q``: the micro-kernel always sees a full tile and never
tests an edge.  The input itself is never copied to add its padding.

A tile may span several output rows; it is packed one output-row run at a
time, and each kernel row ``r`` of a run is one call of
:func:`~cso.packing.vector_copy.pack_row_runs`, which writes the ``S`` panel
rows ``s = 0 .. S-1`` of every channel of the tile:

* stride 1 (vector-based packing): the ``S`` rows are the same input row
  segment shifted by ``s*dw`` elements, each one masked vector load per
  ``lanes`` windows, served from L1 after the first;
* other strides: each row is a masked gather of the elements at
  ``q*sw + s*dw``.

A 1x1, stride-1, unpadded convolution with a small plane needs no input
panel at all: its panel is the input itself with row stride ``H*W`` (see
the loop nests).  A strided 1x1 convolution is packed like any other, its
pixels gathered straight from ``x``.
"""

from __future__ import annotations

from numba import njit

from .vector_copy import pack_row_runs


# Not cached on its own: Numba's cache would not notice a change to the
# intrinsic it calls.  It is compiled into, and cached with, each generated
# loop module, whose file name hashes every source it depends on.
@njit(nogil=True)
def pack_input_panel(
    x_flat,
    image_offset,
    height,
    width,
    pad_top,
    pad_left,
    channel_start,
    channels,
    kernel_height,
    kernel_width,
    stride_h,
    stride_w,
    dilation_h,
    dilation_w,
    out_width,
    windows,
    window_start,
    windows_per_tile,
    panel,
    panel_offset,
):
    """Pack one input panel; see the module contract.

    ``x_flat`` is the unpadded input ``[N][C][H][W]`` flattened and
    ``image_offset`` the start of image ``n``'s group.
    """
    row_stride = kernel_width * windows_per_tile
    channel_stride = kernel_height * row_stride
    plane = height * width
    column = 0
    while column < windows_per_tile:
        window = window_start + column
        if window >= windows:
            # Windows past P*Q: zero columns, so the kernel's extra outputs are harmless.
            for r in range(kernel_height):
                pack_row_runs(
                    panel,
                    panel_offset + r * row_stride + column,
                    windows_per_tile,
                    x_flat,
                    0,
                    0,
                    1,
                    0,
                    kernel_width,
                    windows_per_tile - column,
                    0,
                    channels,
                    channel_stride,
                    0,
                )
            return
        p = window // out_width
        q = window - p * out_width
        run = min(windows_per_tile - column, out_width - q)
        first_column = q * stride_w - pad_left
        first_plane = image_offset + channel_start * plane
        for r in range(kernel_height):
            input_row = p * stride_h + r * dilation_h - pad_top
            # A row in the padding reads nothing: width 0 masks every lane.
            inside = 0 <= input_row < height
            # Kernel row r of every channel of the tile, in one call.
            pack_row_runs(
                panel,
                panel_offset + r * row_stride + column,
                windows_per_tile,
                x_flat,
                first_plane + input_row * width if inside else 0,
                first_column,
                stride_w,
                dilation_w,
                kernel_width,
                run,
                width if inside else 0,
                channels,
                channel_stride,
                plane,
            )
        column += run
