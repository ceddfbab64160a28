"""The integers the loop nests run over, as one typed tuple.

A namedtuple (not a class) so that Numba passes it by value and the
generated loop modules can share one definition.
"""

from collections import namedtuple

LoopBounds = namedtuple(
    "LoopBounds",
    [
        "batch",  # images taken as separate jobs: N, or 1 with the batch folded
        "window_images",  # images whose windows make one job's window run: 1, or N folded
        "groups",  # G
        "channels",  # C per group
        "filters",  # K per group
        "kernel_height",  # R
        "kernel_width",  # S
        "stride_h",
        "stride_w",
        "dilation_h",
        "dilation_w",
        "height",
        "width",  # H, W of the input as given (unpadded)
        "pad_top",
        "pad_left",
        "out_height",
        "out_width",  # P, Q
        "channel_tile",  # Nc
        "l2_tiles",  # K2
        "l3_tiles",  # K3
        "filters_per_tile",  # Nf
        "windows_per_tile",  # Nwin
        "input_in_place",  # 1x1, stride 1, unpadded: full tiles read x directly
        "pack_channels_outer",  # 1x1, stride 1, unpadded: a block's tiles packed channel by channel
        "filters_packed",  # filters are full panels; else KCRS in place + edge panels
        "filters_in_nest",  # WS: each filter tile packed from KCRS just before its use
        "window_parts",  # WS: contiguous parts the window tiles are split into
        "edge_rows",  # edge filter panels are [G][Nf][C*R*S] (dot products), else [G][C*R*S][Nf]
        "workspace_stride",  # elements of the workspace per worker
        "scratch_offset",  # where a worker's edge-tile scratch starts in its part
        "filter_tile_offset",  # where its filter tile starts (filters_in_nest)
    ],
)

DepthwiseBounds = namedtuple(
    "DepthwiseBounds",
    [
        "batch",  # N
        "groups",  # G (= C when depthwise)
        "group_channels",  # C_g = C / G, packed one after another per job
        "multiplier",  # m = K / G, filters per group
        "height",
        "width",  # H, W of the input as given (unpadded)
        "kernel_height",
        "kernel_width",  # R, S
        "stride_h",
        "stride_w",
        "pad_top",
        "pad_left",
        "out_height",
        "out_width",  # P, Q
        "segment",  # outputs per row of a kernel call: Nv * VL
        "rows_per_call",  # output rows per kernel call
        "filters_per_call",  # F: filters per kernel call, a divisor of m
        "columns",  # column taps per call: C_g*S, or C_g*R*S for the one-row kernel
        "rows",  # packed rows per channel: analysis.tap_layout.packed_rows
        "phase_width",  # packed elements per row of each of the stride_w phases
        "workspace_stride",  # elements of the workspace per worker
    ],
)

LaneBounds = namedtuple(
    "LaneBounds",
    [
        "batch",  # N
        "channels",  # C (= K: depthwise, channel multiplier 1)
        "height",
        "width",  # H, W of the input as given (unpadded)
        "kernel_height",  # R
        "taps",  # R*S
        "stride_h",
        "stride_w",
        "dilation_h",
        "pad_top",
        "pad_left",
        "out_height",
        "out_width",  # P, Q
        "outputs",  # pixels a lane-kernel call computes, at most Q
        "packed_rows",  # rows of the packed plane: analysis.lanes.packed_rows
        "pitch",  # pixels a packed row: analysis.lanes.pitch
        "band_rows",  # output rows staged before they are unpacked
        "workspace_stride",  # elements of the workspace per worker
    ],
)

PlaneBounds = namedtuple(
    "PlaneBounds",
    [
        "batch",  # N
        "channels",  # C (= groups: depthwise)
        "filters",  # K = m * C
        "multiplier",  # m: filter k reads input channel k // m
        "height",
        "width",  # H, W of the input as given (unpadded); Q == W
        "out_height",  # P
        "pad_top",
        "pad_left",
        "taps",  # R*S
        "entries",  # mask-table entries a vector: 1 + S + R*S
        "load_span",  # elements a call's whole loads reach: analysis.planes.load_span
        "workers",  # threads the jobs are split over
    ],
)

RowBounds = namedtuple(
    "RowBounds",
    [
        "batch",  # N
        "channels",  # C (= groups: depthwise)
        "filters",  # K = m * C
        "multiplier",  # m: filter k reads input channel k // m
        "height",
        "width",  # H, W of the input as given (unpadded)
        "out_height",
        "out_width",  # P, Q
        "stride_h",
        "stride_w",
        "pad_top",
        "pad_left",
        "taps",  # R*S
        "entries",  # mask-table entries a call: analysis.rows.entries_per_call
        "vector_entries",  # vector-mask-table int32 a call: U * groups * sw * VL
        "load_span",  # input elements a whole-load call reads a row: analysis.rows.load_span
        "filters_per_call",  # F filters side by side in a vector: plane_shapes.filters_per_vector
        "window_rows",  # input rows a call's block of ROWS output rows reads
        "workers",  # threads the jobs are split over
    ],
)

# The fields of a row or lane plan's plane geometry (bounds[START:END]):
# constants of its loop module (cso.macrokernel.family_modules.rows_module,
# lanes_module), the rest arguments.
ROW_PLANE_START = RowBounds._fields.index("height")
ROW_PLANE_END = RowBounds._fields.index("window_rows") + 1
LANE_PLANE_START = LaneBounds._fields.index("height")
LANE_PLANE_END = len(LaneBounds._fields)

WinogradBounds = namedtuple(
    "WinogradBounds",
    [
        "batch",  # N
        "channels",  # C
        "filters",  # K
        "padded_filters",  # K rounded up to whole filter tiles (U and M hold zeros past K)
        "height",
        "width",  # H, W of the input as given (unpadded)
        "out_height",
        "out_width",  # P, Q
        "pad_top",
        "pad_left",
        "tiles_across",  # tw = ceil(Q/2)
        "tiles",  # th * tw
        "block_tiles",  # Tb: the tiles of a block (analysis.winograd.block_tiles)
        "blocks",  # ceil(tiles / Tb)
        "row",  # elements of a V or M block row: Tb and a vector of slack
        "u_stride",
        "v_stride",
        "m_stride",  # elements from one of the 16 planes to the next (winograd.plane_stride)
        "filters_transformed",  # the filters operand is U, packed ahead; else KCRS
        "u_elements",  # a worker's workspace elements for U (0 when packed ahead)
        "workspace_stride",  # elements of the workspace per worker: U, V, M
        "workers",  # threads the jobs (image, block) are split over
    ],
)
