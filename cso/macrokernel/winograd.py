"""The Winograd loop nest: dense 3x3 stride-1 layers as F(2x2, 3x3).

This file is a template as well as a module: ``microkernel`` (the dense
outer-product kernel, tiles in its vectors), ``input_tiles``,
``output_tiles``, ``filter_tiles`` (:mod:`cso.microkernels.winograd_transforms`)
and ``LANES``, ``FILTERS_PER_TILE``, ``WINDOWS_PER_TILE`` are bound per
specialisation (kernel shape, dtype, vector lanes) by
:mod:`cso.macrokernel.family_modules`.  Only loops live here.

Contracts relied on
-------------------
* ``x_flat``: the input ``[N][C][H][W]`` flattened, unpadded: the input
  transform reads it in place, masking the padding to zeros.
* ``w_flat``: the filters ``[K][C][3][3]`` flattened (KCRS), or, where
  ``b.filters_transformed``, ``U`` packed ahead in the layout below
  (:mod:`cso.packing.winograd_filters`), and the workspace holds no ``U``.
* ``bias``: ``(K,)``, or a placeholder when ``has_bias`` is False.
* ``y_flat``: the output ``[N][K][P][Q]`` flattened; every element is
  written once, by the output transform, with the bias and the epilogue
  (``residual`` in its layout, a placeholder unless ``has_residual``).
* ``workspace``: worker ``i``'s part from ``i * b.workspace_stride``:
  ``U`` (``b.u_elements``: 16 planes of ``b.u_stride``: ``[K_pad][C]``, filter ``k``'s
  transformed taps for channel ``c`` at ``k*C + c``, zero past ``K``),
  then ``V`` (16 planes of ``b.v_stride``: ``[C][row]``, tile ``t`` of
  the block at column ``t``), then ``M`` (16 planes of ``b.m_stride``:
  ``[K_pad][row]``).  The micro-kernel reads ``U`` with strides ``(1, C)``
  (the reduction runs over channels), ``V`` with row stride ``row``, and
  writes ``M`` with row stride ``row``, overwriting.
* ``offsets``: unused (a placeholder).  ``bounds``: the
  :class:`~cso.macrokernel.bounds.WinogradBounds` fields.  Worker ``i`` of
  ``b.workers`` takes jobs ``(image, block)`` ``[i*J//W, (i+1)*J//W)``.
"""

from numba import njit

from cso.macrokernel.bounds import WinogradBounds

# Bound by cso.macrokernel.family_modules in each generated specialisation.
microkernel = None
input_tiles = None
output_tiles = None
filter_tiles = None
LANES = None
FILTERS_PER_TILE = None
WINDOWS_PER_TILE = None


@njit(nogil=True, inline="always")
def transform_filters(w_flat, b, workspace, u0):
    """``U = G g G^T`` of every filter, zero past ``K``."""
    for k in range(b.filters):
        for c0 in range(0, b.channels, LANES):
            filter_tiles(
                w_flat, (k * b.channels + c0) * 9, min(LANES, b.channels - c0),
                workspace, u0 + k * b.channels + c0, b.u_stride,
            )  # fmt: skip
    for e in range(16):
        start = u0 + e * b.u_stride
        workspace[start + b.filters * b.channels : start + b.padded_filters * b.channels] = 0.0


@njit(nogil=True, inline="always")
def transform_inputs(x_flat, b, image, first, count, workspace, v0):
    """``V = B^T d B`` of the block's ``count`` tiles from tile ``first``."""
    plane = b.height * b.width
    for c in range(b.channels):
        n = first
        while n < first + count:
            ty = n // b.tiles_across
            tx = n - ty * b.tiles_across
            run = min(b.tiles_across - tx, first + count - n, LANES)
            top = 2 * ty - b.pad_top
            valid = 0
            for a in range(4):
                if 0 <= top + a < b.height:
                    valid |= 1 << a
            input_tiles(
                x_flat, (image * b.channels + c) * plane + top * b.width, valid,
                2 * tx - b.pad_left, b.width, workspace, v0 + c * b.row + n - first, b.v_stride,
            )  # fmt: skip
            n += run


@njit(nogil=True, inline="always")
def products(b, count, bias, residual, u, u0, workspace, v0, m0):
    """``M[e] = U[e] V[e]`` for the 16 positions: the block's kernel calls,
    ``U`` in ``u`` from ``u0``."""
    for e in range(16):
        for f in range(b.padded_filters // FILTERS_PER_TILE):
            for j in range(0, count, WINDOWS_PER_TILE):
                microkernel(
                    b.channels,
                    u, u0 + e * b.u_stride + f * FILTERS_PER_TILE * b.channels, 1,
                    b.channels,
                    workspace, v0 + e * b.v_stride + j, b.row,
                    workspace, m0 + e * b.m_stride + f * FILTERS_PER_TILE * b.row + j, b.row,
                    bias, 0, True, False, residual, 0, 0, False,
                )  # fmt: skip


@njit(nogil=True, inline="always")
def transform_outputs(b, image, first, count, bias, has_bias, residual, activation,
                      has_residual, y_flat, workspace, m0):  # fmt: skip
    """``y = A^T M A + bias``, the epilogue fused, for the block's tiles."""
    for k in range(b.filters):
        # Without a bias, a zero of its type (the placeholder holds one).
        bias_k = bias[k] if has_bias else bias[0] * 0
        plane = (image * b.filters + k) * b.out_height
        n = first
        while n < first + count:
            ty = n // b.tiles_across
            tx = n - ty * b.tiles_across
            run = min(b.tiles_across - tx, first + count - n, LANES)
            output_tiles(
                workspace, m0 + k * b.row + n - first, b.m_stride,
                y_flat, (plane + 2 * ty) * b.out_width + 2 * tx, b.out_width,
                min(2 * run, b.out_width - 2 * tx), 2 * ty + 1 < b.out_height,
                bias_k, residual, activation, has_residual,
            )  # fmt: skip
            n += run


@njit(nogil=True, cache=True)
def convolve_winograd(
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
      U = G g G^T of every filter                # each worker its own
      for job = (image, block of Tb tiles)       # the worker's share
        V = B^T d B of the block's tiles          # input transform
        for e in 16: for filter tile: for Nwin tiles:
          M[e] = U[e] V[e]                        # outer-product kernel
        y = A^T M A + bias, epilogue              # output transform
    """
    b = WinogradBounds(*bounds)
    jobs = b.batch * b.blocks
    if worker < b.workers:  # this call's share of the work
        first_job = worker * jobs // b.workers
        last_job = (worker + 1) * jobs // b.workers
        start = worker * b.workspace_stride
        v0 = start + b.u_elements
        m0 = v0 + 16 * b.v_stride
        # U: the filters operand itself when packed ahead, else transformed here.
        u, u0 = w_flat, 0
        if not b.filters_transformed:
            u, u0 = workspace, start
            if first_job < last_job:
                transform_filters(w_flat, b, workspace, u0)
        for job in range(first_job, last_job):
            image = job // b.blocks
            first = (job - image * b.blocks) * b.block_tiles
            count = min(b.block_tiles, b.tiles - first)
            transform_inputs(x_flat, b, image, first, count, workspace, v0)
            products(b, count, bias, residual, u, u0, workspace, v0, m0)
            transform_outputs(
                b, image, first, count, bias, has_bias, residual, activation, has_residual,
                y_flat, workspace, m0,
            )  # fmt: skip
