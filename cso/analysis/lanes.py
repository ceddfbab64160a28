"""The lane algorithm: depthwise convolutions with channels in the vector lanes.

The tap plan (:mod:`.depthwise`) puts a row segment of one channel in each
vector: a plane narrower than a vector pads most lanes, and every channel
pays its own packing pass and calls.  Here a vector holds one pixel of
``VL`` channels (:mod:`cso.microkernels.lane_taps`): each job, an image's
block of ``VL`` channels, lays its planes out as pixel vectors (an
in-register transpose), runs the lane tap kernel along every output row,
and transposes the pixels back into the output planes with the epilogue.
On a Xeon (Sapphire Rapids) EfficientNet-B0's 7x7 and 14x14 depthwise
layers ran 1.3-3x faster this way; its 112x112 and 56x56 ones, whose
row segments fill the tap kernel's vectors, no faster.  The model weighs
the two per layer.

It takes depthwise layers of channel multiplier 1 (``K == C``), any filter
size, stride, dilation and padding.
"""

from __future__ import annotations

import numpy as np

from ..geometry import ConvGeometry, ceil_div
from . import tap_rules, tiles
from .choices import Algorithm
from .pricing import Traffic
from .depthwise import even_split, job_traffic, per_channel, untiled_plan
from .tap_layout import rows_read
from .hardware import Hardware
from .plan import Plan

is_lane_depthwise = tap_rules.is_lane_depthwise
max_outputs = tap_rules.max_lane_outputs


def outputs_per_call(geometry: ConvGeometry, vector_registers: int) -> int:
    """Pixels one kernel call computes: ``Q`` split evenly into as few runs
    of at most :func:`max_outputs` as cover it (a row's last run starts at
    ``Q - outputs``)."""
    g = geometry
    return even_split(g.out_width, max_outputs(g.kernel_width, vector_registers))


def packed_rows(geometry: ConvGeometry) -> int:
    """Rows of the packed plane: ``max((P-1)*sh + (R-1)*dh + 1, pad_top + H)``,
    every row a tap reads and every input row."""
    g = geometry
    read = rows_read(g.out_height, g.kernel_height, g.stride_h, g.dilation_h)
    return max(read, g.pad_top + g.height)


def pitch(geometry: ConvGeometry) -> int:
    """Pixels per packed row: ``max((Q-1)*sw + (S-1)*dw + 1, pad_left + W)``."""
    g = geometry
    read = rows_read(g.out_width, g.kernel_width, g.stride_w, g.dilation_w)
    return max(read, g.pad_left + g.width)


def pack_targets(geometry: ConvGeometry, lanes: int) -> np.ndarray:
    """Where the lane nest stores each packed pixel vector, as element
    offsets into a worker's part (intp): input pixel ``f = i*W + j`` at
    ``((pad_top + i) * pitch + pad_left + j) * VL``, then filter tap ``t``
    at ``(packed_rows * pitch + t) * VL``.  Computed once per plan, so that
    packing a run of ``VL`` pixels that wraps from one padded row to the
    next costs no arithmetic per pixel."""
    g = geometry
    rows = np.arange(g.height, dtype=np.intp)[:, None] + g.pad_top
    columns = np.arange(g.width, dtype=np.intp)[None, :] + g.pad_left
    pixels = ((rows * pitch(g) + columns) * lanes).ravel()
    taps = (packed_rows(g) * pitch(g) + np.arange(g.kernel_height * g.kernel_width)) * lanes
    return np.concatenate([pixels, taps.astype(np.intp)])


def band_rows(geometry: ConvGeometry, hardware: Hardware, element_bytes: int) -> int:
    """Output rows staged before they are unpacked: as many as fit in a
    quarter of the usable L1 (``l1 / 4 // (Q * VL * s)``), at least 1, at
    most ``P``; the transpose back reads them while they are still there."""
    g = geometry
    l1 = tiles.usable_bytes(hardware.l1_bytes, hardware.usable_fraction)
    lanes = max(1, hardware.vector_bytes // element_bytes)
    return max(1, min(g.out_height, l1 // 4 // (g.out_width * lanes * element_bytes)))


def workspace_elements(geometry: ConvGeometry, lanes: int, band: int) -> int:
    """One worker's part: the packed plane, the block's ``R*S`` filter
    vectors and ``band * Q + VL`` staged pixel vectors (``VL`` to spare
    for the transpose back's whole loads)."""
    g = geometry
    pixels = packed_rows(g) * pitch(g) + g.kernel_height * g.kernel_width
    return (pixels + band * g.out_width + lanes) * lanes


def transposes_per_job(geometry: ConvGeometry, lanes: int, band: int) -> int:
    """``VL x VL`` transposes one job makes: ``ceil(H*W / VL)`` for its
    input planes, ``ceil(R*S / VL)`` for its filters, ``ceil(band*Q / VL)``
    per band of its output."""
    g = geometry
    full, last = divmod(g.out_height, band)
    out = full * ceil_div(band * g.out_width, lanes) + ceil_div(last * g.out_width, lanes)
    return (
        ceil_div(g.height * g.width, lanes)
        + ceil_div(g.kernel_height * g.kernel_width, lanes)
        + out
    )


def lane_kernel_loads(geometry: ConvGeometry, outputs: int) -> int:
    """Vector loads of one call: per filter row, the ``S`` tap vectors and
    the input columns the run reads (``(outputs-1)*sw + (S-1)*dw + 1``, or
    fewer when stride and dilation skip some)."""
    g = geometry
    columns = {
        q * g.stride_w + s * g.dilation_w for q in range(outputs) for s in range(g.kernel_width)
    }
    return g.kernel_height * (g.kernel_width + len(columns))


def lane_traffic(
    geometry: ConvGeometry, hardware: Hardware, element_bytes: int, outputs: int, threads: int
) -> Traffic:
    """What one channel of one image costs under the lane nest, modelled.

    Counts per job (an image's block of ``VL`` channels), then divided by
    ``VL``: the compulsory bytes (``VL`` input planes, filters and output
    planes) from the level the whole call's operands fit in; each
    transposed element (``VL^2`` a transpose, :func:`transposes_per_job`)
    at ``lane_transpose_cost`` (measured by ``python -m cso calibrate``);
    ``P * ceil(Q / outputs)`` kernel calls of
    ``outputs * R*S`` vector multiply-adds and :func:`lane_kernel_loads`
    loads, priced by :func:`~cso.analysis.depthwise.tap_kernel_cost`.  All
    scaled by the busiest thread's share of the ``N * ceil(C / VL)`` jobs.
    """
    g = geometry
    s = element_bytes
    lanes = max(1, hardware.vector_bytes // s)
    calls = g.out_height * ceil_div(g.out_width, outputs)
    job = job_traffic(
        hardware,
        s,
        threads,
        jobs=g.batch * ceil_div(g.groups, lanes),
        job_bytes=lanes * (g.height * g.width + g.kernel_height * g.kernel_width + g.windows) * s,
        calls=calls,
        macs=calls * outputs * g.kernel_height * g.kernel_width * lanes,
        # One call's loads feed every lane: counted per vector, like the tap kernel's.
        loads=calls * lane_kernel_loads(g, outputs),
        packed_elements=transposes_per_job(g, lanes, band_rows(g, hardware, s)) * lanes * lanes,
        input_pack_cost=hardware.weights.lane_transpose_cost,
    )
    # Per channel, as the tap plan and the dense plans are priced per group.
    return per_channel(job, lanes)


def plan_lanes(
    geometry: ConvGeometry, dtype_name: str, hardware: Hardware, threads: int,
    filters_prepacked: bool = False,
) -> Plan:  # fmt: skip
    """The lane plan of ``geometry`` (which must be :func:`is_lane_depthwise`);
    ``filters_prepacked`` changes nothing (packed, the filters are the KCRS rows)."""
    element_bytes = np.dtype(dtype_name).itemsize
    outputs = outputs_per_call(geometry, hardware.vector_registers)
    traffic = lane_traffic(geometry, hardware, element_bytes, outputs, threads)
    return untiled_plan(
        geometry, dtype_name, hardware, threads, traffic, Algorithm.DEPTHWISE_LANES, outputs
    )
