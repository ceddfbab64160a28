"""Which layers the Winograd family runs, and its tile's sizes: the rules
the planner and the plan checks share (:mod:`.winograd` plans)."""

from __future__ import annotations

from ..geometry import ConvGeometry

# Outputs a tile computes along each side, and the input tile it reads.
TILE = 2
INPUT_TILE = 4
# Positions of a transformed tile: the number of products.
POSITIONS = INPUT_TILE * INPUT_TILE


def is_winograd(geometry: ConvGeometry) -> bool:
    """Whether F(2x2, 3x3) runs the layer: one group, 3x3 filters, stride
    and dilation 1."""
    g = geometry
    return (
        g.groups == 1
        and g.kernel_height == 3
        and g.kernel_width == 3
        and g.stride_h == 1
        and g.stride_w == 1
        and g.dilation_h == 1
        and g.dilation_w == 1
    )
