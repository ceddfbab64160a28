"""The depthwise loop nest: one input channel at a time, packed once, all its taps.

This file is a template as well as a module: ``tap_kernel`` and
``VECTOR_TOKEN`` are bound per specialisation (segment vectors, dtype,
vector lanes) by :mod:`cso.macrokernel.specialise`.  Only loops live here.

Contracts relied on
-------------------
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded.  Groups are
  the channels: output channel ``k`` reads input channel ``k // m``
  (``m = K / C``, the channel multiplier), as in PyTorch.
* ``w_flat``: the filters ``[K][1][R][S]`` flattened: channel ``k``'s ``T =
  R*S`` taps from ``k * T``.
* ``offsets``: ``[T]`` intp, tap ``t = r*S + s``'s start in the packed channel
  relative to an output's (:mod:`cso.packing.depthwise`): ``phase(s) * rows
  * phase_width + r * dilation_h * phase_width + (s * dilation_w) // stride_w``.
* ``y_flat``: the output ``[N][K][P][Q]`` flattened; every element is written.
* ``residual``: ``y_flat``'s layout (a placeholder unless ``has_residual``).
  The epilogue ``y = act(y + residual)`` (``act`` numbered by
  ``activation``, 0: none) is the tap kernel's, in registers; rows that
  span a scratch plane get the activation there when there is no residual,
  and the whole epilogue from ``epilogue_run`` once copied when there is.
* ``workspace``: ``W`` parts of ``b.workspace_stride`` elements, one per
  worker, each holding one packed channel (and one segment more), and with
  ``b.spans_rows`` from ``b.scratch_offset`` a scratch plane of whole
  segments: output ``(p, q)`` at ``p * phase_width + q``, whose first ``Q``
  columns of each row are copied to ``y``.  Worker ``i`` of ``W`` takes
  jobs ``(image, channel)`` ``[i*J//W, (i+1)*J//W)``.
"""

from numba import njit, prange

from cso.packing.depthwise import pack_channel_phases
from cso.packing.vector_copy import copy_run

# Bound by cso.macrokernel.specialise in each generated specialisation.
tap_kernel = None
VECTOR_TOKEN = None
epilogue_run = None


@njit(nogil=True, parallel=True, cache=True)
def convolve_depthwise(
    x_flat, w_flat, bias, has_bias, residual, activation, has_residual, y_flat, workspace,
    offsets, b
):
    """::

    for worker                                         # parallel
     for job = (image, input channel c)                # the worker's share
       pack channel c's phases                          # once, ~ L1/L2
       for k in c's m output channels
         (spanning rows: for i0 in segments of the (P-1)*width + Q run,
          into the scratch plane, then copy each row's Q outputs; else)
         for p in P output rows
           for q0 in segments of Nv*VL outputs
             tap kernel: y[k, p, q0:] = bias + sum_t w[k, t] * IN[offsets[t] + ...]
    """
    segment = b.segment
    taps = b.kernel_height * b.kernel_width
    plane = b.height * b.width
    jobs = b.batch * b.channels
    filters = b.channels * b.multiplier
    outputs = b.out_height * b.out_width
    workers = workspace.size // b.workspace_stride
    for worker in prange(workers):
        start = worker * b.workspace_stride
        buffer = workspace[start : start + b.workspace_stride]
        for job in range(worker * jobs // workers, (worker + 1) * jobs // workers):
            image = job // b.channels
            channel = job % b.channels
            pack_channel_phases(
                x_flat,
                job * plane,
                b.height,
                b.width,
                b.pad_top,
                b.pad_left,
                b.stride_w,
                b.rows,
                b.phase_width,
                buffer,
                0,
                VECTOR_TOKEN,
            )
            for j in range(b.multiplier):
                k = channel * b.multiplier + j
                bias_value = bias[k] if has_bias else bias[0] * 0
                out_start = (image * filters + k) * outputs
                if b.spans_rows:
                    # Stride 1 down: packed rows are consecutive, so a segment
                    # runs on into the next row; each row's last columns are dropped.
                    # The residual is in y's layout, not the plane's: it waits for the copy.
                    plane_activation = 0 if has_residual else activation
                    spanned = (b.out_height - 1) * b.phase_width + b.out_width
                    for i0 in range(0, spanned, segment):
                        tap_kernel(
                            taps,
                            w_flat,
                            k * taps,
                            offsets,
                            buffer,
                            i0,
                            buffer,
                            b.scratch_offset + i0,
                            segment,
                            bias_value,
                            residual,
                            0,
                            plane_activation,
                            False,
                        )
                    for p in range(b.out_height):
                        row = out_start + p * b.out_width
                        copy_run(
                            y_flat,
                            row,
                            buffer,
                            b.scratch_offset + p * b.phase_width,
                            b.out_width,
                            VECTOR_TOKEN,
                        )
                        if has_residual:
                            epilogue_run(
                                y_flat, row, residual, row, b.out_width, activation, True
                            )
                    continue
                for p in range(b.out_height):
                    row_start = p * b.stride_h * b.phase_width
                    for q0 in range(0, b.out_width, segment):
                        out_offset = out_start + p * b.out_width + q0
                        tap_kernel(
                            taps,
                            w_flat,
                            k * taps,
                            offsets,
                            buffer,
                            row_start + q0,
                            y_flat,
                            out_offset,
                            min(segment, b.out_width - q0),
                            bias_value,
                            residual,
                            out_offset,
                            activation,
                            has_residual,
                        )
