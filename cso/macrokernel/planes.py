"""The plane loop nest: stride-1 depthwise convolutions on the planes as given.

This file is a template as well as a module: ``plane_tap_kernel``,
``plane_tap_kernel_edges``, ``plane_tap_kernel_checked`` and ``LANES`` are
bound per specialisation
(the filter size and dilations, vectors a call, dtype, vector lanes) by
:mod:`cso.macrokernel.specialise`.  Only loops live here.

Contracts relied on (:mod:`cso.microkernels.plane_taps` for the kernel's)
-------------------------------------------------------------------------
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded, read in place.
* ``WHOLE_PLANE``: True where a call computes a whole plane
  (:func:`cso.analysis.planes.whole_plane_call`): ``plane_tap_kernel_edges``
  is then :mod:`cso.microkernels.whole_plane_taps`' kernel, called once a
  job from the plane's start.
* ``w_flat``: the filters ``[K][1][R][S]`` flattened (KCRS); filter ``k``
  reads input channel ``k // m``.
* ``bias``: ``(K,)``, or a placeholder when ``has_bias`` is False.
* ``y_flat``: the output ``[N][K][P][Q]`` flattened, ``Q == W``; every
  element is written.  ``residual``: its layout (a placeholder unless
  ``has_residual``).
* ``offsets`` (int32, :func:`cso.analysis.planes.plane_offsets`): the
  number of calls ``n`` a plane takes, ``n`` triples ``(v0, checked,
  vector_masks)`` (``vector_masks``: where the call's lane-vector masks
  start: column masks, or a checked call's tap masks), then the mask table
  from ``1 + 3n``, ``b.entries`` entries a vector, then the vector masks.
* A checked call runs ``plane_tap_kernel_edges`` (whole loads, each tap's
  lane-vector mask; the plane's last vector's tail stored apart in the
  plane's last call) where its loads' ``b.load_span`` elements lie in
  ``x_flat``, else ``plane_tap_kernel_checked`` (masked loads and stores):
  only calls at the very start and end of the input.
* ``workspace``: unused (nothing is packed).
* ``bounds``: the :class:`~cso.macrokernel.bounds.PlaneBounds` fields as a
  plain tuple.  Worker ``i`` of ``b.workers`` takes jobs ``(image,
  filter)`` ``[i*J//W, (i+1)*J//W)``.
"""

from numba import njit

from cso.macrokernel.bounds import PlaneBounds

# Bound by cso.macrokernel.specialise in each generated specialisation.
plane_tap_kernel = None
plane_tap_kernel_edges = None
plane_tap_kernel_checked = None
LANES = None
WHOLE_PLANE = None


@njit(nogil=True, cache=True)
def convolve_planes(
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

    for worker                                  # parallel
     for job = (image, filter k)                # the worker's share
       for (v0, checked, vector_masks) in the plane's calls   # the same for every plane
         plane tap kernel (unchecked, edges, or masked at the input's ends):
           y[k][v0*VL:(v0+U)*VL] = bias + sum of R*S shifted, masked taps
    """
    b = PlaneBounds(*bounds)
    jobs = b.batch * b.filters
    plane = b.height * b.width
    outputs = b.out_height * b.width
    calls = offsets[0]
    masks_at = 1 + 3 * calls
    shift = b.pad_top * b.width + b.pad_left
    inputs = x_flat.size
    if worker < b.workers:  # this call's share of the work
        first = worker * jobs // b.workers
        # The job's image, filter and input channel counted, not divided out:
        # on an AMD EPYC (Zen 5), one thread, side by side, `dw 3x3 960 @7` ran
        # 1.14x faster so (11.1 against 12.7 us a call) and `384 @14` 1.06x.
        image = first // b.filters
        k = first % b.filters
        channel = k // b.multiplier
        phase = k % b.multiplier
        for job in range(first, (worker + 1) * jobs // b.workers):
            source = (image * b.channels + channel) * plane - shift
            target = job * outputs
            if WHOLE_PLANE:
                # One call, from the plane's start: no table of calls to read.
                if source >= 0 and source + b.load_span <= inputs:
                    plane_tap_kernel_edges(
                        x_flat, source, b.width, w_flat, k * b.taps, offsets, masks_at,
                        offsets[3], True, y_flat, target, bias, k, has_bias, residual, target,
                        activation, has_residual,
                    )  # fmt: skip
                else:
                    plane_tap_kernel_checked(
                        x_flat, source, b.width, w_flat, k * b.taps, offsets, masks_at,
                        offsets[3], False, y_flat, target, bias, k, has_bias, residual, target,
                        activation, has_residual,
                    )  # fmt: skip
            for call in range(0 if WHOLE_PLANE else calls):
                v0 = offsets[1 + 3 * call]
                at = v0 * LANES
                vector_masks = offsets[3 + 3 * call]
                if not offsets[2 + 3 * call]:
                    plane_tap_kernel(
                        x_flat, source + at, b.width, w_flat, k * b.taps,
                        offsets, masks_at + v0 * b.entries, vector_masks, False, y_flat,
                        target + at, bias, k, has_bias, residual, target + at, activation,
                        has_residual,
                    )  # fmt: skip
                elif source + at >= 0 and source + at + b.load_span <= inputs:
                    plane_tap_kernel_edges(
                        x_flat, source + at, b.width, w_flat, k * b.taps,
                        offsets, masks_at + v0 * b.entries, vector_masks, call == calls - 1,
                        y_flat, target + at, bias, k, has_bias, residual, target + at,
                        activation, has_residual,
                    )  # fmt: skip
                else:
                    plane_tap_kernel_checked(
                        x_flat, source + at, b.width, w_flat, k * b.taps,
                        offsets, masks_at + v0 * b.entries, vector_masks, False, y_flat,
                        target + at, bias, k, has_bias, residual, target + at, activation,
                        has_residual,
                    )  # fmt: skip
            k += 1
            phase += 1
            if phase == b.multiplier:
                phase = 0
                channel += 1
            if k == b.filters:
                k = 0
                channel = 0
                image += 1
