"""The row loop nest: depthwise convolutions on the planes as given, a block
of output rows at a time.

This file is a template as well as a module: ``row_tap_kernel``, ``ROWS``,
``LANES``, ``PLANE`` and ``row_blocks`` are bound per specialisation (the
filter size, dilations, strides, rows and vectors a call, dtype, vector
lanes, the plane's geometry) by :mod:`cso.macrokernel.family_modules`.
Only loops live here.

Contracts relied on (:mod:`cso.microkernels.row_taps` for the kernel's)
-----------------------------------------------------------------------
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded, read in place.
* ``w_flat``: the filters ``[K][1][R][S]`` flattened (KCRS); filter ``k``
  reads input channel ``k // m``.
* ``bias``: ``(K,)``, or a placeholder when ``has_bias`` is False.
* ``y_flat``: the output ``[N][K][P][Q]`` flattened; every element is
  written.  ``residual``: its layout (a placeholder unless ``has_residual``).
* ``offsets`` (int32, :func:`cso.analysis.rows.row_offsets`): the number of
  calls ``n`` a row takes, their ``q0``, the mask table from ``1 + n``,
  ``b.entries`` entries a call, then the vector mask table,
  ``b.vector_entries`` a call.
* ``workspace``: not read (the launch's placeholder, :mod:`cso.launch`):
  the kernel skips the window rows off the plane rather than read zeros.
* ``row_tap_kernel`` loads whole (``whole_loads``): a call runs it where
  every element its on-plane rows' whole vectors reach lies in ``x_flat``
  (all but the blocks at the very start and end of the input), and the
  masked ``row_tap_kernel_checked`` elsewhere.
* ``bounds``: the :class:`~cso.macrokernel.bounds.RowBounds` fields as a
  plain tuple, its plane's fields equal to ``PLANE`` (which the nest reads
  instead, where it is not None).  Worker ``i`` of ``b.workers`` takes jobs ``(image,
  F filters)`` ``[i*J//W, (i+1)*J//W)`` for ``F = b.filters_per_call``: one
  filter, or ``F`` side by side in each vector
  (:func:`cso.analysis.plane_shapes.filters_per_vector`, multiplier 1), the
  last job's ``K mod F`` where ``F`` does not divide ``K``; the kernel
  then reads the next filters' planes ``H*W`` input and ``P*Q`` output
  elements on.  ``ROWS <= P``: a plane's blocks
  start every ``ROWS`` rows, the last at ``P - ROWS``
  (:func:`cso.analysis.rows.block_starts`), and read ``b.window_rows``
  input rows from ``p*sh - pad_top``, those on the plane
  (:func:`cso.analysis.rows.window_rows_on_plane`) from the input.
"""

from numba import njit

from cso.macrokernel.bounds import ROW_PLANE_END, ROW_PLANE_START, RowBounds

# Bound by cso.macrokernel.specialise in each generated specialisation.
row_tap_kernel = None
row_tap_kernel_checked = None
ROWS = None
LANES = None
# The plane's geometry: the RowBounds fields from height to window_rows
# (bounds[ROW_PLANE_START:ROW_PLANE_END]), constants of the specialisation;
# None in a module that reads them from the bounds (for measurements).
PLANE = None
# A job's blocks: loop_row_blocks, or where the plane's geometry is constant
# and its blocks few, a function calling row_block at each block's first
# row written out (cso.macrokernel.family_modules).
row_blocks = None


@njit(nogil=True, inline="always")
def row_block(
    p, b, job, k, valid, source, x_flat, w_flat, bias, has_bias, residual, activation,
    has_residual, y_flat, workspace, offsets,
):  # fmt: skip
    """The block of ``ROWS`` output rows from row ``p`` of output plane
    ``job`` (filter ``k`` of its image; ``valid`` filters from it side by
    side), its input plane at ``source``: each of a row's calls."""
    calls = offsets[0]
    masks_at = 1 + calls
    vector_masks_at = masks_at + calls * b.entries
    inputs = x_flat.size
    top = p * b.stride_h - b.pad_top
    i_first = max(0, -top)
    i_last = min(b.window_rows, b.height - top)
    row = source + top * b.width - b.pad_left
    target = job * b.out_height * b.out_width + p * b.out_width
    for call in range(calls):
        q0 = offsets[1 + call]
        at = row + q0 * b.stride_w
        if at + i_first * b.width >= 0 and (at + (i_last - 1) * b.width + b.load_span <= inputs):
            row_tap_kernel(
                x_flat, at, b.width, i_first, i_last,
                w_flat, k * b.taps, y_flat, target + q0, b.out_width,
                offsets, masks_at + call * b.entries,
                vector_masks_at + call * b.vector_entries,
                bias, k, has_bias, residual, target + q0, activation, has_residual,
                b.height * b.width, b.out_height * b.out_width, b.out_width, valid,
            )  # fmt: skip
        else:
            row_tap_kernel_checked(
                x_flat, at, b.width, i_first, i_last,
                w_flat, k * b.taps, y_flat, target + q0, b.out_width,
                offsets, masks_at + call * b.entries,
                vector_masks_at + call * b.vector_entries,
                bias, k, has_bias, residual, target + q0, activation, has_residual,
                b.height * b.width, b.out_height * b.out_width, b.out_width, valid,
            )  # fmt: skip


@njit(nogil=True, inline="always")
def loop_row_blocks(
    b, job, k, valid, source, x_flat, w_flat, bias, has_bias, residual, activation,
    has_residual, y_flat, workspace, offsets,
):  # fmt: skip
    """Every block of a job's plane, in a loop: the first rows every
    ``ROWS``, the last at ``P - ROWS``."""
    for block in range(0, b.out_height, ROWS):
        row_block(
            min(block, b.out_height - ROWS), b, job, k, valid, source, x_flat, w_flat, bias,
            has_bias, residual, activation, has_residual, y_flat, workspace, offsets,
        )  # fmt: skip


@njit(nogil=True, cache=True)
def convolve_rows(
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

    for worker                                   # parallel
     for job = (image, filters k .. k+F-1)       # the worker's share
       for p in the blocks' first rows           # every ROWS, the last at P - ROWS
         window rows i_first <= i < i_last fall on the plane
         for (j, q0) in the row's calls          # the same for every row
           row tap kernel, whole loads unless at the input's ends:
             y[k][p : p+ROWS][q0 : q0 + U*VL] = bias + sum of R*S taps
    """
    # The plane's geometry from this specialisation's constants, not the
    # bounds given (the same values, cso.launch checks): LLVM then folds each
    # block's row addresses, masks and bounds into its code.  Side by side
    # with it taken from the bounds (a Xeon, one thread, the nest alone,
    # warm): dw 5x5 672 @14 1.23x faster, 5x5 240 @28 1.12x, 5x5/2 144 @56
    # 1.08x, 3x3 32 @112 1.2x, 3x3 144 @56 1.02x.  (PLANE None: a module for
    # every plane, a measurement's, experiments/row_plane_constants.py.)
    if PLANE is None:
        b = RowBounds(*bounds)
    else:
        b = RowBounds(*(bounds[:ROW_PLANE_START] + PLANE + bounds[ROW_PLANE_END:]))
    filter_blocks = (b.filters + b.filters_per_call - 1) // b.filters_per_call
    jobs = b.batch * filter_blocks
    plane = b.height * b.width
    if worker < b.workers:  # this call's share of the work
        for job in range(worker * jobs // b.workers, (worker + 1) * jobs // b.workers):
            image = job // filter_blocks
            k = (job % filter_blocks) * b.filters_per_call
            valid = min(b.filters_per_call, b.filters - k)
            source = (image * b.channels + k // b.multiplier) * plane
            row_blocks(
                b, image * b.filters + k, k, valid, source, x_flat, w_flat, bias, has_bias,
                residual, activation, has_residual, y_flat, workspace, offsets,
            )  # fmt: skip
