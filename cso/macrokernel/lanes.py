"""The lane loop nest: depthwise convolutions with ``VL`` channels in the vector lanes.

This file is a template as well as a module: ``lane_pack``,
``lane_tap_kernel``, ``lane_unpack`` and ``LANES`` are bound per
specialisation (the filter width, horizontal stride and dilation, pixels a
call, dtype, vector lanes) by :mod:`cso.macrokernel.specialise`.  Only
loops live here.

The staged band is deliberate.  A kernel of ``VL`` pixels that stored them
to the output planes itself (its ``VL x VL`` accumulators transposed in
registers, the epilogue applied, no band and no unpacking pass) was tried:
on a Zen 3 (AVX2) it took 1.05x the staged nest's time over EfficientNet-B0's
and MobileNetV2's depthwise layers with rows of at least ``VL`` pixels
(0.97-1.2x a layer, timed side by side in one process), the staged nest
running its kernel on longer runs (10 or 11 pixels against 8).

Contracts relied on (:mod:`cso.microkernels.lane_taps` for the layouts)
------------------------------------------------------------------------
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded; depthwise
  with channel multiplier 1 (``K == C``).
* ``w_flat``: the filters ``[K][1][R][S]`` flattened (KCRS).
* ``bias``: ``(K,)``, or a placeholder when ``has_bias`` is False.
* ``y_flat``: the output ``[N][K][P][Q]`` flattened; every element is
  written.  ``residual``: its layout (a placeholder unless
  ``has_residual``); the epilogue is applied as pixels are unpacked.
* ``offsets``: intp, where each packed pixel vector goes in a worker's
  part: the ``H*W`` input pixels, then the ``R*S`` filter taps
  (:func:`cso.analysis.lanes.pack_targets`).
* ``bounds``: the :class:`~cso.macrokernel.bounds.LaneBounds` fields as a
  plain tuple, its plane's fields equal to ``PLANE`` (which the nest reads
  instead, where it is not None); ``b.outputs <= Q``: a row's last run of pixels starts at
  ``Q - outputs`` and overlaps the one before, computing some outputs twice,
  alike.
* ``workspace``: ``W`` parts of ``b.workspace_stride`` elements, one per
  worker, each: the packed plane (``b.packed_rows x b.pitch`` pixel
  vectors, whose padding this nest zeroes once a call: every job rewrites
  the same inside), the block's ``R*S`` filter vectors, and a band of
  ``b.band_rows * Q`` staged pixel vectors plus ``LANES`` to spare.
  Worker ``i`` of ``W`` takes jobs ``(image, block of LANES channels)``
  ``[i*J//W, (i+1)*J//W)``.
"""

from numba import njit

from cso.macrokernel.bounds import LANE_PLANE_START, LaneBounds

# Bound by cso.macrokernel.specialise in each generated specialisation.
lane_pack = None
lane_tap_kernel = None
lane_unpack = None
LANES = None
# The plane's geometry: the LaneBounds fields from height on
# (bounds[LANE_PLANE_START:]), constants of the specialisation; None in a
# module that reads them from the bounds (for measurements).
PLANE = None


@njit(nogil=True, cache=True)
def convolve_lanes(
    worker,
    x_flat,
    w_flat,
    bias,
    has_bias,
    residual,
    activation,
    has_residual,
    y_flat,
    workspace,
    offsets,
    bounds,
):
    """::

    for worker                                          # parallel
     for job = (image, block of LANES channels)         # the worker's share
       lay out the block's filters, then its input planes, as pixel vectors
       for band of band_rows output rows
         for p in the band
           for q0 in runs of `outputs` pixels (the last ending at Q)
             lane tap kernel: staged[p, q0:q0+outputs] = bias + sum of R*S taps
         unpack the band's pixels to the block's output planes (epilogue applied)
    """
    # The plane's geometry from this specialisation's constants, not the
    # bounds given (the same values, cso.launch checks): LLVM then folds the
    # transposes' and the kernel's loops and offsets.  Side by side with it
    # taken from the bounds (a Xeon, one thread, the nest alone, warm): dw
    # 5x5 1152 @7 1.18-1.22x faster, 5x5/2 672 @14 1.14-1.17x.
    if PLANE is None:
        b = LaneBounds(*bounds)
    else:
        b = LaneBounds(*(bounds[:LANE_PLANE_START] + PLANE))
    blocks = (b.channels + LANES - 1) // LANES
    jobs = b.batch * blocks
    plane = b.height * b.width
    outputs = b.out_height * b.out_width
    packed = b.packed_rows * b.pitch * LANES
    filters_at = packed
    staged_at = packed + b.taps * LANES
    row_step = b.dilation_h * b.pitch * LANES
    last_column = b.out_width - b.outputs
    workers = workspace.size // b.workspace_stride
    if worker < workers:  # this call's share of the work
        start = worker * b.workspace_stride
        buffer = workspace[start : start + b.workspace_stride]
        buffer[:packed] = 0
        for job in range(worker * jobs // workers, (worker + 1) * jobs // workers):
            image = job // blocks
            k0 = (job % blocks) * LANES
            valid = min(LANES, b.channels - k0)
            for t0 in range(0, b.taps, LANES):
                lane_pack(
                    w_flat, k0 * b.taps + t0, b.taps, min(LANES, b.taps - t0), valid,
                    buffer, offsets, plane + t0,
                )  # fmt: skip
            source = (image * b.channels + k0) * plane
            for f0 in range(0, plane, LANES):
                lane_pack(
                    x_flat, source + f0, plane, min(LANES, plane - f0), valid,
                    buffer, offsets, f0,
                )  # fmt: skip
            target = (image * b.channels + k0) * outputs
            for p0 in range(0, b.out_height, b.band_rows):
                p1 = min(p0 + b.band_rows, b.out_height)
                for p in range(p0, p1):
                    row_start = p * b.stride_h * b.pitch
                    staged_row = staged_at + (p - p0) * b.out_width * LANES
                    for q0 in range(0, b.out_width, b.outputs):
                        q = min(q0, last_column)
                        lane_tap_kernel(
                            b.kernel_height, buffer, filters_at, buffer,
                            (row_start + q * b.stride_w) * LANES, row_step,
                            buffer, staged_row + q * LANES, bias, k0, valid, has_bias,
                        )  # fmt: skip
                band = (p1 - p0) * b.out_width
                for f0 in range(0, band, LANES):
                    lane_unpack(
                        buffer, staged_at + f0 * LANES, min(LANES, band - f0), valid,
                        y_flat, target + p0 * b.out_width + f0, outputs,
                        residual, activation, has_residual,
                    )  # fmt: skip
