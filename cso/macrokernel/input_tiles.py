"""The dense loop nests' input packing step: a block of window tiles packed
into consecutive panels, or left in place where the kernel reads the input
itself.

The panels' layout, ``[Nc*R*S][Nwin]`` a tile with explicit zeros at every
edge, and when a tile is read in place or packed channel by channel, are
the contract written at the top of :mod:`cso.macrokernel.loops`, whose
nests call :func:`pack_window_tiles`.  ``operands`` is the nests' tuple of
arrays (``x_flat`` first, the worker's panels sixth), ``b`` their
:class:`~cso.macrokernel.bounds.LoopBounds`, ``vector`` the packing's
vector token of the plan's width (:func:`~cso.packing.transpose.vector_token`).
"""

from numba import njit

from cso.macrokernel.nest_indexing import reads_in_place
from cso.packing.inputs import pack_input_panel, pack_pointwise_panels


# Inlined by Numba into the loop nests (as their _tile is): as calls, every
# micro-kernel call also passed a tuple of seven arrays and some twenty
# scalars, and ResNet-50 ran 1.02-1.04x slower, its 1x1 layers with 64
# channels 1.14-1.21x (experiments/variants.py --variant outlined).
@njit(nogil=True, inline="always")
def pack_window_tile(
    operands, b, image, group, channel_start, channels, window_start, panel_offset, vector
):
    """Pack one input tile into ``panels``, unless the kernel reads it in place."""
    if reads_in_place(b, window_start):
        return
    x_flat, panels = operands[0], operands[5]
    image_offset = (image * b.groups + group) * b.channels * b.height * b.width
    pack_input_panel(
        x_flat,
        image_offset,
        b.height,
        b.width,
        b.pad_top,
        b.pad_left,
        channel_start,
        channels,
        b.kernel_height,
        b.kernel_width,
        b.stride_h,
        b.stride_w,
        b.dilation_h,
        b.dilation_w,
        b.out_width,
        b.window_images * b.out_height * b.out_width,
        window_start,
        b.windows_per_tile,
        panels,
        panel_offset,
        b.out_height * b.out_width,
        b.groups * b.channels * b.height * b.width,
        vector,
    )


@njit(nogil=True, inline="always")
def pack_window_tiles(
    operands, b, image, group, channel_start, channels, first_tile, tiles, panel_size, vector
):
    """Pack window tiles ``[first_tile, first_tile + tiles)`` into consecutive
    panels ``panel_size`` apart: channel by channel for a 1x1 block (each
    image's run of whole tiles at once, a tile past an image's end on its
    own), else one tile at a time."""
    nwin = b.windows_per_tile
    if b.pack_channels_outer:
        plane = b.height * b.width
        image_windows = b.out_height * b.out_width
        t = 0
        while t < tiles:
            window_start = (first_tile + t) * nwin
            image_index = image + window_start // image_windows
            local = window_start % image_windows
            run = min(tiles - t, (image_windows - local) // nwin)
            if run == 0:
                pack_window_tile(
                    operands, b, image, group, channel_start, channels, window_start,
                    t * panel_size, vector,
                )  # fmt: skip
                t += 1
                continue
            pack_pointwise_panels(
                operands[0],
                ((image_index * b.groups + group) * b.channels + channel_start) * plane,
                plane,
                channels,
                local,
                run,
                nwin,
                operands[5],
                t * panel_size,
                panel_size,
                vector,
            )
            t += run
        return
    for t in range(tiles):
        pack_window_tile(
            operands,
            b,
            image,
            group,
            channel_start,
            channels,
            (first_tile + t) * nwin,
            t * panel_size,
            vector,
        )
