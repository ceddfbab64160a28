"""The tap loop nest (depthwise and grouped): one group at a time, packed once, all its taps.

This file is a template as well as a module: ``tap_kernel`` and
``VECTOR_TOKEN`` are bound per specialisation (the kernel's filter height,
stride and dilation down, rows and vectors, dtype, vector lanes) by
:mod:`cso.macrokernel.specialise`.  Only loops live here.

Contracts relied on
-------------------
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded.  Group ``g``
  is input channels ``[g*C_g, (g+1)*C_g)`` and output channels ``[g*m,
  (g+1)*m)`` (``m = K / G``), as in PyTorch; depthwise, ``C_g = 1``.
* ``w_flat``: the filters ``[K][C_g][R][S]`` flattened (KCRS): filter
  ``k``'s ``T = C_g*R*S`` taps from ``k * T``.
* ``offsets``: intp, the kernel's ``b.columns`` column offsets, where each
  column tap starts in the packed group relative to its output row, then
  the weight offsets of each (block row, column tap) in a KCRS filter
  (:func:`cso.analysis.tap_layout.kernel_offsets`).
* ``y_flat``: the output ``[N][K][P][Q]`` flattened; every element is written.
* ``residual``: ``y_flat``'s layout (a placeholder unless ``has_residual``).
  The epilogue ``y = act(y + residual)`` (``act`` numbered by
  ``activation``, 0: none) is the tap kernel's, in registers.
* ``b.rows_per_call <= P``: a plane's last block of rows starts at ``P -
  rows_per_call``, and a row's last segment at ``max(0, Q - segment)``, so
  that every call's rows and, unless the kernel is masked (``Q <
  segment``), its whole vectors are outputs; the overlapped outputs are
  computed twice, alike.
* ``bounds``: the :class:`~cso.macrokernel.bounds.DepthwiseBounds` fields
  as a plain tuple (typed faster by Numba's dispatcher than a namedtuple).
* ``workspace``: ``W`` parts of ``b.workspace_stride`` elements, one per
  worker, each holding one packed group: its ``C_g`` channels
  (:mod:`cso.packing.depthwise`) one after another, each ``stride_w``
  phases of ``b.rows`` rows of ``b.phase_width``.  At stride 1 this nest
  zeroes a worker's part once a call and packs only the input rows into
  it.  Worker ``i``
  of ``W`` takes jobs ``(image, group)`` ``[i*J//W, (i+1)*J//W)``.
"""

from numba import njit

from cso.macrokernel.bounds import DepthwiseBounds
from cso.packing.depthwise import pack_channel_phases, pack_channel_rows

# Bound by cso.macrokernel.specialise in each generated specialisation.
tap_kernel = None
VECTOR_TOKEN = None


@njit(nogil=True, cache=True)
def convolve_depthwise(
    worker, x_flat, w_flat, bias, has_bias, residual, activation, has_residual, y_flat, workspace,
    offsets, bounds
):
    """::

    for worker                                         # parallel
     for job = (image, group g)                        # the worker's share
       pack g's C_g channels' phases (stride 1: their rows;  # once, ~ L1/L2
         the padding zeroed once a call)
       for k0 in g's m output channels, filters_per_call at a time
         for p0 in blocks of rows_per_call output rows (the last ending at P)
           for q0 in segments of Nv*VL outputs (the last ending at Q)
             tap kernel: y[k0:k0+F, p0:p0+rows, q0:] = bias + sum_t w[k, t] * IN[...]
    """
    b = DepthwiseBounds(*bounds)
    segment = b.segment
    block = b.rows_per_call
    taps = b.group_channels * b.kernel_height * b.kernel_width
    plane = b.height * b.width
    channel_stride = b.stride_w * b.rows * b.phase_width
    jobs = b.batch * b.groups
    filters = b.groups * b.multiplier
    outputs = b.out_height * b.out_width
    last_row = b.out_height - block
    last_column = max(0, b.out_width - segment)
    # Without a bias, `bias` is one zero, read for every filter.
    bias_step = 1 if has_bias else 0
    workers = workspace.size // b.workspace_stride
    if worker < workers:  # this call's share of the work
        start = worker * b.workspace_stride
        buffer = workspace[start : start + b.workspace_stride]
        if b.stride_w == 1:
            # The padding, once a call: every job writes the same inside.
            buffer[: b.group_channels * channel_stride] = 0
        for job in range(worker * jobs // workers, (worker + 1) * jobs // workers):
            image = job // b.groups
            group = job % b.groups
            for c in range(b.group_channels):
                # Two functions, not one with an inside-only flag: the flag ran
                # the small planes' nests 0.7-0.8x as fast (Xeon), though the
                # packing alone timed alike.
                if b.stride_w == 1:
                    pack_channel_rows(
                        x_flat,
                        (job * b.group_channels + c) * plane,
                        b.height,
                        b.width,
                        b.pad_top,
                        b.pad_left,
                        b.rows,
                        b.phase_width,
                        buffer,
                        c * channel_stride,
                        VECTOR_TOKEN,
                    )
                else:
                    pack_channel_phases(
                        x_flat,
                        (job * b.group_channels + c) * plane,
                        b.height,
                        b.width,
                        b.pad_top,
                        b.pad_left,
                        b.stride_w,
                        b.rows,
                        b.phase_width,
                        buffer,
                        c * channel_stride,
                        VECTOR_TOKEN,
                    )
            for j in range(0, b.multiplier, b.filters_per_call):
                k = group * b.multiplier + j
                out_start = (image * filters + k) * outputs
                for p0 in range(0, b.out_height, block):
                    p = min(p0, last_row)
                    row_start = p * b.stride_h * b.phase_width
                    for q0 in range(0, b.out_width, segment):
                        q = min(q0, last_column)
                        out_offset = out_start + p * b.out_width + q
                        tap_kernel(
                            b.columns,
                            w_flat,
                            k * taps,
                            taps,
                            offsets,
                            buffer,
                            row_start + q,
                            b.phase_width,
                            y_flat,
                            out_offset,
                            b.out_width,
                            outputs,
                            min(segment, b.out_width - q),
                            bias,
                            k * bias_step,
                            bias_step,
                            residual,
                            out_offset,
                            activation,
                            has_residual,
                        )
