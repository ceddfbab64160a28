"""Input packing: windows of the input into input panels, zeros for padding.

Packed-layout contract
----------------------
An input panel for channels ``[c0, c0 + nc)`` and windows ``[w0, w0 + Nwin)``
of image ``n`` is ``[nc*R*S][Nwin]``::

    panel[(c*R + r)*S + s][j] = x[n][c0 + c][p*sh + r*dh - pad_top][q*sw + s*dw - pad_left]

with ``w0 + j = p*Q + q``, and zero where that index falls in the padding
or ``w0 + j >= P*Q``: the micro-kernel always sees a full tile and never
tests an edge.  The input itself is never copied to add its padding.

With the batch folded into the windows (``Plan.batch_folded``) the windows
are numbered across images, ``w0 + j = n*P*Q + p*Q + q``, so one panel may
hold the last windows of image ``n`` and the first of image ``n + 1``; the
zero columns are then those past ``N*P*Q``.

A tile may span several output rows; it is packed one output-row run at a
time, and each kernel row ``r`` of a run is one call of
:func:`~cso.packing.vector_copy.pack_row_runs`, which writes the ``S`` panel
rows ``s = 0 .. S-1`` of every channel of the tile:

* stride 1 (vector-based packing): the ``S`` rows are the same input row
  segment shifted by ``s*dw`` elements, each one masked vector load per
  ``lanes`` windows, served from L1 after the first;
* other strides: each row is a masked gather of the elements at
  ``q*sw + s*dw``.

A run that ends inside a panel row stores its last vector whole, lanes
past the run included, which the next run of the tile then overwrites (runs are
packed left to right).  A run that is a whole panel row (the tile lies in one
output row) stores its last vector whole too, into the rows after it up to
its channel's last row (kernel row ``r``'s calls precede ``r + 1``'s, and a
call writes ``s`` in order): later copies and calls rewrite them.  Only the
last vector of a channel's last row, or of a row's last run when the tile
spans output rows, is stored in plain pieces (a masked store is microcoded
on AMD).

A 1x1, stride-1, unpadded convolution with a small plane needs no input
panel at all: its panel is the input itself with row stride ``H*W`` (see
the loop nests).  With a larger plane its panels are the same layout as
above, but a whole block of tiles is packed at once, channel by channel
(:func:`pack_pointwise_panels`): each channel's row of ``x`` is then read
as a run of ``POINTWISE_CHUNK`` tiles, not ``Nwin`` elements per row and
tile.  A strided 1x1 convolution is packed like any other, its pixels
gathered straight from ``x``.
"""

from __future__ import annotations

from numba import njit

from .vector_copy import pack_row_runs

# Tiles per channel-by-channel pass of pack_pointwise_panels.  Each pass reads
# POINTWISE_CHUNK*Nwin elements of a channel's row and writes one row of as
# many panels: more tiles make longer reads but scatter the writes over more
# pages.  On ResNet-50's 1x1 layers 8, 16 and a whole block each ran 1.03-1.04x
# faster in total than tile by tile; 8 was the one with every layer faster
# (1.02-1.07x), where a whole block left 64->64 @56 at 0.99x.
POINTWISE_CHUNK = 8


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
    image_windows,
    image_elements,
    vector,
):
    """Pack one input panel; see the module contract.

    ``x_flat`` is the unpadded input ``[N][C][H][W]`` flattened and
    ``image_offset`` the start of the group in the image of window 0.
    ``windows`` is where the zero columns start (``P*Q``, or ``N*P*Q``
    folded); window ``w`` is in image ``w // image_windows`` (``P*Q``),
    ``image_elements`` (``G*C*H*W``) further on in ``x_flat``.  ``vector``
    is the vector token of the plan's width
    (:func:`~cso.packing.transpose.vector_token`).
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
                    windows_per_tile - column,
                    0,
                    0,
                    channels,
                    channel_stride,
                    0,
                    vector,
                )
            return
        # A run ends at its output row's end, so it never crosses into another image.
        image = window // image_windows
        local = window - image * image_windows
        p = local // out_width
        q = local - p * out_width
        run = min(windows_per_tile - column, out_width - q)
        first_column = q * stride_w - pad_left
        first_plane = image_offset + image * image_elements + channel_start * plane
        # A run that is its tile's whole panel row may store its last vector
        # whole into the rows after it, up to its channel's last row, which
        # later copies and calls rewrite; other runs keep to their own row,
        # whose next run (or this one's pieces) fills it.  On a Xeon (Sapphire
        # Rapids class) 3x3 layers' panels of 14- and 7-wide tiles (32x14f,
        # 48x7f) packed 1.17-1.34x faster so (64 @56, 128 @28, 256 @14 and their
        # stride-2 kin; 48-wide tiles the same), both ways in one process.
        whole_row = column == 0 and run == windows_per_tile
        for r in range(kernel_height):
            room = windows_per_tile - column
            room_step = 0
            if whole_row:
                room = windows_per_tile * (1 + (kernel_height - 1 - r) * kernel_width)
                room_step = windows_per_tile
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
                room,
                room_step,
                width if inside else 0,
                channels,
                channel_stride,
                plane,
                vector,
            )
        column += run


@njit(nogil=True)
def pack_pointwise_panels(
    x_flat,
    first_plane,
    plane,
    channels,
    window_start,
    tiles,
    windows_per_tile,
    panels,
    panel_offset,
    panel_size,
    vector,
):
    """Pack ``tiles`` consecutive window tiles of one image of a 1x1, stride-1,
    unpadded convolution into the panels at ``panels[panel_offset +
    t*panel_size:]``, channel by channel.

    The same panels as :func:`pack_input_panel` makes tile by tile (zero
    columns past the plane's end), but each channel's row of ``x`` (from
    ``first_plane``, ``plane`` elements apart) is read ``POINTWISE_CHUNK``
    tiles at a time as one contiguous run.  Tile by tile, each step reads
    ``Nwin`` elements of one channel and moves a whole plane on: once the
    plane is more than a page, every step opens another page, which the
    hardware prefetchers do not follow.  ``python experiments/variants.py
    --variant tile-by-tile`` times both.
    """
    # Rows are channels (one panel row apart), copies are tiles (one panel
    # apart, Nwin windows further into the row); windows past the plane read
    # beyond the row's width and come out zero.
    for chunk in range(0, tiles, POINTWISE_CHUNK):
        pack_row_runs(
            panels,
            panel_offset + chunk * panel_size,
            panel_size,
            x_flat,
            first_plane,
            window_start + chunk * windows_per_tile,
            1,
            windows_per_tile,
            min(POINTWISE_CHUNK, tiles - chunk),
            windows_per_tile,
            windows_per_tile,
            0,
            plane,
            channels,
            windows_per_tile,
            plane,
            vector,
        )
