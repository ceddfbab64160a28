"""The plane plan's analysis: its mask table and call schedule, against
brute force."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cso.analysis import planes
from cso.geometry import make_geometry


@st.composite
def plane_geometries(draw):
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    left = draw(st.integers(0, (S - 1) * dw))
    top, bottom = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    H, W = draw(st.integers(1, 12)), draw(st.integers(1, 30))
    padding = ((top, bottom), (left, (S - 1) * dw - left))
    try:
        geometry = make_geometry(
            (1, 4, H, W), (4, 1, R, S), padding=padding, dilation=(dh, dw), groups=4
        )
    except ValueError:
        geometry = make_geometry((1, 4, 3, 3), (4, 1, 1, 1), groups=4)
    return geometry, draw(st.sampled_from([8, 16]))


@settings(max_examples=80, deadline=None)
@given(plane_geometries())
def test_the_masks_say_which_taps_fall_on_the_plane(case):
    g, lanes = case
    assert planes.is_plane_depthwise(g)
    table, checked = planes.mask_table(g, lanes)
    entries = planes.mask_entries(g)
    table = table.reshape(-1, entries).view(np.uint32).astype(np.int64)
    outputs = g.out_height * g.out_width
    for v in range(planes.output_vectors(g, lanes)):
        needs_check = False
        for lane in range(lanes):
            f = v * lanes + lane
            p, q = divmod(f, g.out_width)
            assert bool(table[v, 0] >> lane & 1) == (f < outputs)
            for s in range(g.kernel_width):
                column = f < outputs and 0 <= q + s * g.dilation_w - g.pad_left < g.width
                assert bool(table[v, 1 + s] >> lane & 1) == column
                for r in range(g.kernel_height):
                    row = 0 <= p + r * g.dilation_h - g.pad_top < g.height
                    tap = table[v, 1 + g.kernel_width + r * g.kernel_width + s]
                    assert bool(tap >> lane & 1) == (column and row)
                    needs_check |= column and not row
            needs_check |= f >= outputs
        assert checked[v] == needs_check


@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 6))
def test_the_calls_cover_every_vector_and_end_at_the_last(flags, per_call):
    checked = np.array(flags)
    per_call = min(per_call, len(flags))
    calls = planes.call_schedule(checked, per_call)
    covered = np.zeros(len(flags), bool)
    for v0, is_checked in calls:
        assert 0 <= v0 <= len(flags) - per_call
        assert is_checked == bool(checked[v0 : v0 + per_call].any())
        covered[v0 : v0 + per_call] = True
    assert covered.all()
    assert calls[-1][0] == len(flags) - per_call
