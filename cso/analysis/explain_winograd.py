"""A Winograd plan's story: the tiles, the blocks, the products and the
transforms, weighed against the other plans of the layer."""

from __future__ import annotations

import numpy as np

from . import winograd
from .explain_text import size_text


def winograd_story(plan, others, compulsory) -> list:
    """The lines that tell ``plan``'s (a Winograd plan's) story.

    ``others`` are the plans it was weighed against (``(label, plan)``) and
    ``compulsory`` the line on the call's compulsory traffic.
    """
    g = plan.geometry
    s = np.dtype(plan.dtype).itemsize
    nf, nwin, vl = plan.filters_per_tile, plan.windows_per_tile, plan.vector_lanes
    th, tw = winograd.tile_grid(g)
    tiles = th * tw
    per_block = winograd.plan_block_tiles(plan)
    sizes = winograd.block_sizes(tiles, per_block)
    filters = winograd.padded_filters(g.filters, nf)
    u_stride, v_stride, m_stride, row, elements = winograd.workspace_elements(
        g, nf, per_block, vl, s
    )
    traffic = plan.cost_of(plan.schedule)
    direct_macs = g.flops // 2
    weighed = "; ".join(
        f"{label} {other.cost_of(other.schedule).cost:.3g}" for label, other in others
    )
    return [
        "Algorithm: Winograd F(2x2, 3x3): each 2x2 block of outputs from the 4x4 block of "
        "input around it",
        f"  {th} x {tw} = {tiles} tiles an image; U = G g G^T (16 x {g.filters} x {g.channels}), "
        f"V = B^T d B (16 x {g.channels} x tiles), M = U V (16 products), y = A^T M A + bias",
        f"  products on the {nf}x{nwin}w outer-product micro-kernel ({nwin} tiles in its "
        f"vectors, {nf} filters broadcast), reduction over the {g.channels} channels: "
        f"{traffic.padded_macs / 1e6:.2f} M multiply-adds an image with the padding of "
        f"{filters - g.filters} filter(s) and the blocks' last kernel calls, against "
        f"{direct_macs / g.batch / 1e6:.2f} M direct "
        f"({direct_macs / g.batch / traffic.padded_macs:.2f}x)",
        f"  blocks of {per_block} tiles ({len(sizes)} an image): a block's V and M "
        f"({size_text(16 * (v_stride + m_stride) * s)}) stay in L2 from the input transform "
        f"through the products to the output transform; each worker's U "
        f"({size_text(16 * u_stride * s)}) transformed once a call; workspace "
        f"{size_text(elements * s)} a worker",
        "  the 16 planes of U, V and M start an odd number of cache lines apart, in 16 L1 sets",
        "  transforms: input from the unpacked input (the padding masked), output with the bias "
        "and the fused epilogue in registers, filters gathered from KCRS",
        compulsory,
        "",
        "Choice",
        f"  {plan.algorithm}: modelled cost {traffic.cost:.3g} an image "
        f"({traffic.kernel_calls} kernel calls, {traffic.packed_input_elements} transformed input "
        f"and output elements, {traffic.packed_filter_elements} transformed filter elements); "
        + weighed,
        f"  busiest thread {traffic.imbalance:.3f}x an even share of the {g.batch * len(sizes)} "
        "(image, block) jobs",
    ] + (
        [
            f"  not taken unforced: U ({size_text(traffic.packed_filter_elements * s)}) exceeds L2 "
            f"and the call has {g.batch * tiles} tiles, no more than a block may hold "
            f"({winograd.MAX_BLOCK_TILES}): too few multiply-adds for each element of U "
            "streamed from beyond L2 (winograd.streams_filters_once)"
        ]
        if winograd.streams_filters_once(plan)
        else []
    ) + [
        "",
        "Loop nest",
        f"  for worker in {plan.threads} thread(s): U = G g G^T of every filter"
        + (", unless packed ahead (cso.pack_filters stores U)" if plan.filters_prepacked else ""),
        f"    for (image, block) in {g.batch} x {len(sizes)} jobs, the worker's share",
        f"      V = B^T d B of the block's tiles ({vl} tiles a transform call)",
        f"      for e in 16: for filter tile in {filters // nf}: for {nwin} tiles of the block: "
        f"M[e] = U[e] V[e]",
        f"      y = A^T M A + bias, epilogue ({vl} tiles a transform call)",
    ]
