"""The tap kernels' packed channel and the offsets a call reads it by.

Packed layout (the contract of :mod:`cso.packing.depthwise`, read by the
tap kernel, :mod:`cso.microkernels.taps`, through the nest of
:mod:`cso.macrokernel.depthwise`): a group's ``C_g`` channels one after
another, ``E`` (:func:`packed_channel_elements`) apart, each ``stride_w``
phases of ``rows x width``::

    buffer[c*E + (phase*rows + row)*width + j]
        = x[c][row - pad_top][j*stride_w + phase - pad_left]   (zero outside x)

    rows  = (P - 1)*stride_h + (R - 1)*dilation_h + 1              (packed_rows)
    width = ceil((max(Q, seg) + ((S - 1)*dw) // sw) / VL) * VL    (phase_width)

so that every tap of any stride and dilation is one contiguous vector load,
at :func:`column_offsets` from the start of its output row's input (``p *
stride_h * width + q``), and its weight at :func:`weight_offsets`' index
in the KCRS filter, read in place.  Pure functions of the geometry, the row
segment and the lanes.
"""

from __future__ import annotations

from ..geometry import ConvGeometry, ceil_div


def rows_read(output_rows: int, kernel_height: int, stride_h: int, dilation_h: int) -> int:
    """Input rows that ``output_rows`` consecutive output rows read:
    ``(rows - 1) * stride_h + (R - 1) * dilation_h + 1``."""
    return (output_rows - 1) * stride_h + (kernel_height - 1) * dilation_h + 1


def kernel_shape(geometry: ConvGeometry, rows_per_call: int) -> tuple:
    """``(R, stride_h, dilation_h)`` the tap kernel unrolls: the layer's for a
    block of rows; ``(1, 1, 1)`` for the one-row kernel, whose columns are
    then all ``R*S`` taps (each tap's row folded into its column offset)."""
    g = geometry
    if rows_per_call > 1:
        return g.kernel_height, g.stride_h, g.dilation_h
    return 1, 1, 1


def kernel_columns(geometry: ConvGeometry, rows_per_call: int) -> int:
    """Column taps the tap kernel loops over: ``C_g * S``, or ``C_g * R*S``
    for the one-row kernel (``C_g = 1`` when depthwise)."""
    g = geometry
    rows = g.kernel_height // kernel_shape(g, rows_per_call)[0]
    return g.channels_per_group * g.kernel_width * rows


def packed_rows(geometry: ConvGeometry) -> int:
    """Input rows one packed channel holds: ``(P - 1) * stride_h + (R - 1) * dilation_h + 1``
    (the last block of rows starts early enough to end at the last row)."""
    g = geometry
    return rows_read(g.out_height, g.kernel_height, g.stride_h, g.dilation_h)


def phase_width(geometry: ConvGeometry, segment: int, lanes: int) -> int:
    """Elements per packed row of each phase: ``max(Q, seg) + ((S-1) * dw) // sw``,
    so that every load of a row's segments is inside the packed row, rounded
    up to whole vectors of ``lanes``, so that the packing stores no partial
    vector (the rows take as many stores either way)."""
    g = geometry
    reach = (g.kernel_width - 1) * g.dilation_w // g.stride_w
    return ceil_div(max(g.out_width, segment) + reach, lanes) * lanes


def packed_channel_elements(geometry: ConvGeometry, segment: int, lanes: int) -> int:
    """One packed channel: ``stride_w`` phases of ``rows x phase_width``."""
    g = geometry
    return g.stride_w * packed_rows(g) * phase_width(g, segment, lanes)


def packed_channel_writes(geometry: ConvGeometry, segment: int, lanes: int) -> int:
    """Elements a job writes packing one channel.  Stride 1: the rows that
    hold the input, each up to the vector holding its last column,
    ``rows_in * min(phase_width, ceil((pad_left + W) / lanes) * lanes)``
    (the tap nest zeroes the rest of the packed channel once a call,
    :func:`cso.packing.depthwise.pack_channel_rows`); otherwise the whole
    packed channel, :func:`packed_channel_elements`."""
    g = geometry
    if g.stride_w != 1:
        return packed_channel_elements(g, segment, lanes)
    rows = packed_rows(g)
    first = min(max(g.pad_top, 0), rows)
    inside = min(max(g.pad_top + g.height, first), rows) - first
    width = min(phase_width(g, segment, lanes), ceil_div(g.pad_left + g.width, lanes) * lanes)
    return inside * width


def column_offsets(
    geometry: ConvGeometry, segment: int, lanes: int, rows_per_call: int = 1
) -> list:
    """Where each column tap of the kernel starts in the packed group,
    relative to its output's row: for channel ``c`` of the group and ``s <
    S``, column ``t = c*S + s`` at ``c * E + phase(s) * rows * width + (s *
    dw) // sw`` (``E`` = :func:`packed_channel_elements`); for the one-row
    kernel, tap ``t = (r*C_g + c)*S + s`` at that plus ``r * dilation_h *
    width``.  Each tap's weight is found by :func:`weight_offsets`."""
    g = geometry
    rows, width = packed_rows(g), phase_width(g, segment, lanes)
    channel = packed_channel_elements(g, segment, lanes)
    columns = [
        c * channel
        + (s * g.dilation_w % g.stride_w) * rows * width
        + s * g.dilation_w // g.stride_w
        for c in range(g.channels_per_group)
        for s in range(g.kernel_width)
    ]
    if rows_per_call > 1:
        return columns
    return [r * g.dilation_h * width + c for r in range(g.kernel_height) for c in columns]


def weight_offsets(geometry: ConvGeometry) -> list:
    """Where the kernel's weight for row ``r`` of its block and column tap
    ``t`` (:func:`column_offsets`' order) is in a KCRS filter, at index
    ``r*T + t``: ``c*R*S + r*S + s`` (for the one-row kernel, ``r`` is 0 and
    the filter row is the tap's own: the same list for every block height,
    ``r``, ``c``, ``s`` in order).  The filters are read in place."""
    g = geometry
    R, S, C = g.kernel_height, g.kernel_width, g.channels_per_group
    return [c * R * S + r * S + s for r in range(R) for c in range(C) for s in range(S)]


def kernel_offsets(geometry: ConvGeometry, segment: int, lanes: int, rows_per_call: int = 1):
    """The tap kernel's ``column_offsets`` argument: :func:`column_offsets`
    then :func:`weight_offsets`."""
    return column_offsets(geometry, segment, lanes, rows_per_call) + weight_offsets(geometry)
