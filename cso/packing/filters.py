"""Filter packing: KCRS filters into the micro-kernel's filter panels.

Packed-layout contract
----------------------
``packed`` is 1-D, laid out as ``[G][T_f][C_g*R*S][Nf]`` with
``T_f = ceil(K_g / Nf)``: for group ``g`` and filter tile ``f``, row
``k = (c*R + r)*S + s`` holds element ``k`` of filters ``f*Nf .. f*Nf+Nf-1``
side by side.  Filters beyond ``K_g`` are zero, so the last tile is full.

Because the reduction index runs over channels outermost, the panel of any
channel tile ``[c0, c0 + Nc)`` is the contiguous run of rows starting at
``c0*R*S``: its offset is :func:`filter_panel_offset`, and the packing does
not depend on the channel tile at all, only on ``Nf``.

``bias`` is packed the same way, ``[G][T_f*Nf]``, zero beyond ``K_g``.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from ..geometry import ceil_div


def pack_filters_panels(w: np.ndarray, groups: int, filters_per_tile: int, dtype) -> np.ndarray:
    """Pack ``w[K][C_g][R][S]`` into ``[G][T_f][C_g*R*S][Nf]`` (flattened), zero-padded."""
    filters, channels_per_group, height, width = w.shape
    filters_per_group = filters // groups
    tiles = ceil_div(filters_per_group, filters_per_tile)
    reduction = channels_per_group * height * width
    padded = np.zeros((groups, tiles * filters_per_tile, reduction), dtype=dtype)
    padded[:, :filters_per_group, :] = w.reshape(groups, filters_per_group, reduction)
    panels = padded.reshape(groups, tiles, filters_per_tile, reduction).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(panels).reshape(-1)


def pack_bias(bias, filters: int, groups: int, filters_per_tile: int, dtype) -> np.ndarray:
    """Pack ``bias[K]`` (or zeros when ``None``) as ``[G][T_f*Nf]`` (flattened)."""
    filters_per_group = filters // groups
    padded_filters = ceil_div(filters_per_group, filters_per_tile) * filters_per_tile
    packed = np.zeros((groups, padded_filters), dtype=dtype)
    if bias is not None:
        packed[:, :filters_per_group] = np.asarray(bias).reshape(groups, filters_per_group)
    return packed.reshape(-1)


@register_jitable
def filter_panel_offset(group: int, filter_tile: int, channel_start: int, filter_tiles: int,
                        reduction: int, kernel_area: int, filters_per_tile: int) -> int:
    """Element offset of the panel for (group, filter tile, channel tile start)."""
    return ((group * filter_tiles + filter_tile) * reduction
            + channel_start * kernel_area) * filters_per_tile
