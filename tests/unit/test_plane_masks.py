"""The plane and row plans' analysis: their mask tables and call schedules,
against brute force."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cso.analysis import planes, rows
from cso.geometry import make_geometry

# The vector registers of the machines with these lanes (AVX2, AVX-512).
REGISTERS = {8: 16, 16: 32}


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
                    # Unchecked loads are whole: every lane's source must lie on the plane.
                    source = f + (r * g.dilation_h - g.pad_top) * g.width
                    source += s * g.dilation_w - g.pad_left
                    needs_check |= not 0 <= source < g.height * g.width
            needs_check |= f >= outputs
        assert checked[v] == needs_check


@settings(max_examples=60, deadline=None)
@given(plane_geometries(), st.integers(1, 4))
def test_the_column_masks_repeat_every_period_and_match_the_bit_sets(case, per_call):
    g, lanes = case
    table, checked = planes.mask_table(g, lanes)
    entries = planes.mask_entries(g)
    bit_sets = table.reshape(-1, entries).view(np.uint32).astype(np.int64)
    period = planes.column_period(g, lanes)
    columns = planes.column_table(g, lanes, per_call)
    assert columns.shape == (period + per_call - 1, g.kernel_width, lanes)
    assert set(np.unique(columns)) <= {0, -1}
    for v in range(planes.output_vectors(g, lanes)):
        if checked[v]:
            continue
        # Every call reads rows v0 % T + u: the vector's own columns, lane by lane.
        for s in range(g.kernel_width):
            expected = [bool(bit_sets[v, 1 + s] >> lane & 1) for lane in range(lanes)]
            assert list(columns[v % period, s] == -1) == expected


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


@st.composite
def row_geometries(draw):
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = ((draw(st.integers(0, 3)), draw(st.integers(0, 3))),
               (draw(st.integers(0, 3)), draw(st.integers(0, 3))))  # fmt: skip
    H, W = draw(st.integers(1, 12)), draw(st.integers(1, 70))
    try:
        geometry = make_geometry(
            (1, 4, H, W), (4, 1, R, S), stride=stride, padding=padding, dilation=dilation,
            groups=4,
        )  # fmt: skip
    except ValueError:
        geometry = make_geometry((1, 4, 3, 3), (4, 1, 1, 1), groups=4)
    return geometry, draw(st.sampled_from([8, 16]))


@settings(max_examples=80, deadline=None)
@given(row_geometries())
def test_the_row_masks_match_brute_force(case):
    g, lanes = case
    assert rows.is_row_depthwise(g)
    vectors = rows.row_vectors_per_call(g, lanes, REGISTERS[lanes])
    table = rows.mask_table(g, lanes, vectors).view(np.uint32).astype(np.int64)
    groups = rows.load_groups(g.kernel_width, g.dilation_w, g.stride_w)
    # Every tap is in one group, at its offset plus its phase.
    assert sorted(s for taps in groups.values() for s, _ in taps) == list(range(g.kernel_width))
    for e, taps in groups.items():
        assert all(e + phase == s * g.dilation_w for s, phase in taps)
    starts = rows.row_calls(g.out_width, vectors * lanes)
    per_vector = 1 + len(groups) * g.stride_w
    assert len(table) == len(starts) * vectors * per_vector
    at = 0
    for q0 in starts:
        for u in range(vectors):
            for lane in range(lanes):
                q = q0 + u * lanes + lane
                assert bool(table[at] >> lane & 1) == (q < g.out_width)
                for k, e in enumerate(groups):
                    for half in range(g.stride_w):
                        column = q0 * g.stride_w - g.pad_left + u * lanes * g.stride_w
                        column += e + half * lanes + lane
                        entry = table[at + 1 + k * g.stride_w + half]
                        assert bool(entry >> lane & 1) == (0 <= column < g.width)
            at += per_vector


@settings(max_examples=80, deadline=None)
@given(row_geometries())
def test_the_masks_of_filters_side_by_side_match_brute_force(case):
    # Output column q of filter f sits in lane f*Q + q; at phase t its tap of
    # load group e reads position (f*Q + q)*sw + t of the loaded halves, the
    # input column q*sw + t + e - pad_left of filter f's row.
    g, lanes = case
    side = rows.filters_per_vector(g, lanes)
    if side == 1:
        assert 2 * g.out_width > lanes
        return
    groups = list(rows.load_groups(g.kernel_width, g.dilation_w, g.stride_w))
    per_filter = 1 + len(groups) * g.stride_w
    table = rows.mask_table(g, lanes, 1, side).view(np.uint32).astype(np.int64)
    assert len(table) == side * per_filter == rows.entries_per_call(g, 1, side)
    expected = np.zeros((side, per_filter), np.int64)
    for f in range(side):
        for q in range(g.out_width):
            expected[f, 0] |= 1 << (f * g.out_width + q)
            for k, e in enumerate(groups):
                for t in range(g.stride_w):
                    half, lane = divmod((f * g.out_width + q) * g.stride_w + t, lanes)
                    column = q * g.stride_w + t + e - g.pad_left
                    if 0 <= column < g.width:
                        expected[f, 1 + k * g.stride_w + half] |= 1 << lane
    assert list(table) == list(expected.ravel())


@settings(max_examples=80, deadline=None)
@given(row_geometries(), st.integers(1, 16))
def test_the_on_plane_taps_match_brute_force(case, rows_per_call):
    g, _ = case
    rows_per_call = min(rows_per_call, g.out_height)
    blocks = rows.on_plane_taps(g, rows_per_call)
    starts = rows.block_starts(g.out_height, rows_per_call)
    assert len(blocks) == len(starts)
    for (window_rows, pairs), p in zip(blocks, starts):
        read = {
            (b * g.stride_h + r * g.dilation_h, b, r)
            for b in range(rows_per_call)
            for r in range(g.kernel_height)
            if 0 <= p * g.stride_h - g.pad_top + b * g.stride_h + r * g.dilation_h < g.height
        }
        assert pairs == len(read)
        assert window_rows == len({i for i, _, _ in read})


@settings(max_examples=80, deadline=None)
@given(row_geometries(), st.integers(1, 16))
def test_the_blocks_cover_every_output_row_and_read_their_window(case, rows_per_call):
    g, _ = case
    rows_per_call = min(rows_per_call, g.out_height)
    starts = rows.block_starts(g.out_height, rows_per_call)
    covered = set()
    for p in starts:
        assert 0 <= p <= g.out_height - rows_per_call
        covered |= set(range(p, p + rows_per_call))
    assert covered == set(range(g.out_height))
    window = rows.block_window_rows(g, rows_per_call)
    for p in starts:
        top = p * g.stride_h - g.pad_top
        first, last = rows.window_rows_on_plane(top, window, g.height)
        on = [i for i in range(window) if 0 <= top + i < g.height]
        assert list(range(first, last)) == on


@given(st.integers(1, 200), st.integers(1, 64))
def test_the_row_calls_cover_the_row(width, span):
    starts = rows.row_calls(width, span)
    covered = set()
    for q0 in starts:
        assert q0 >= 0
        covered |= set(range(q0, min(q0 + span, width)))
    assert covered == set(range(width))
    assert starts[-1] + span == width or (width < span and starts == [0])


@settings(max_examples=80, deadline=None)
@given(row_geometries())
def test_inner_vectors_are_unmasked_only_where_every_lane_is_inside(case):
    g, lanes = case
    vectors = rows.row_vectors_per_call(g, lanes, REGISTERS[lanes])
    inside = vectors > 2
    groups = rows.load_groups(g.kernel_width, g.dilation_w, g.stride_w)
    for q0 in rows.row_calls(g.out_width, vectors * lanes):
        for u in range(1, vectors - 1):
            for lane in range(lanes):
                inside &= q0 + u * lanes + lane < g.out_width
                for e in groups:
                    for half in range(g.stride_w):
                        column = q0 * g.stride_w - g.pad_left + u * lanes * g.stride_w
                        inside &= 0 <= column + e + half * lanes + lane < g.width
    assert rows.full_interior_vectors(g, lanes, vectors) == inside


def test_a_call_holds_a_whole_row_where_the_registers_keep_four_rows_of_it():
    def per_call(width, lanes, registers):
        g = make_geometry((1, 4, 9, width), (4, 1, 3, 3), padding=1, groups=4)
        return rows.row_vectors_per_call(g, lanes, registers)

    # 32 registers: up to 8 vectors a call (4 rows of 8), a wider row split evenly.
    assert [per_call(w, 16, 32) for w in (14, 56, 112, 128, 129, 224)] == [1, 4, 7, 8, 5, 7]
    # 16 registers: calls of 4 vectors at most, as before.
    assert [per_call(w, 8, 16) for w in (14, 28, 56, 112)] == [2, 4, 4, 4]
    # The blocks of a whole 112-wide row: 32 // 7 = 4 rows.
    g = make_geometry((1, 4, 112, 112), (4, 1, 3, 3), padding=1, groups=4)
    assert rows.max_block_rows(g, 32, 16) == 4


def test_inner_vectors_by_hand():
    def full(width, kernel=3, stride=1, dilation=1, lanes=16):
        padding = dilation * (kernel - 1) // 2
        g = make_geometry(
            (1, 4, 9, width), (4, 1, kernel, kernel), stride=stride, padding=padding,
            dilation=dilation, groups=4,
        )  # fmt: skip
        vectors = rows.row_vectors_per_call(g, lanes, REGISTERS[lanes])
        return rows.full_interior_vectors(g, lanes, vectors)

    # 56 outputs, one call of 4 vectors: vectors 1 and 2 read columns 15-48.
    assert full(56) and full(112) and full(112, stride=2)
    # 40 outputs, 3 vectors: vector 1 reads columns 15-32.
    assert full(40)
    # 2 vectors a call have no inner one; dilation 12 reaches past column 55.
    assert not full(20) and not full(56, dilation=12)


@settings(max_examples=60, deadline=None)
@given(row_geometries())
def test_the_row_vector_masks_and_tail_match_the_bit_sets(case):
    g, lanes = case
    vectors = rows.row_vectors_per_call(g, lanes, REGISTERS[lanes])
    bit_sets = rows.mask_table(g, lanes, vectors).view(np.uint32).astype(np.int64)
    per_vector = rows.entries_per_call(g, vectors) // vectors
    bit_sets = bit_sets.reshape(-1, vectors, per_vector)
    masks = rows.vector_mask_table(g, lanes, vectors)
    assert masks.shape == (len(bit_sets), vectors, per_vector - 1, lanes)
    for index in np.ndindex(masks.shape[:3]):
        call, u, load = index
        expected = [-1 if bit_sets[call, u, 1 + load] >> lane & 1 else 0 for lane in range(lanes)]
        assert list(masks[index]) == expected
    # The whole-load kernel stores whole, but for a narrow row's last vector's tail.
    tail = rows.tail_lanes(g, lanes, vectors)
    stored = [sum(int(bit_sets[c, u, 0] >> lane & 1) for lane in range(lanes))
              for c in range(len(bit_sets)) for u in range(vectors)]  # fmt: skip
    if tail:
        assert stored == [lanes] * (vectors - 1) + [tail]
    else:
        assert stored == [lanes] * len(stored)


@settings(max_examples=60, deadline=None)
@given(plane_geometries())
def test_the_plane_offsets_point_each_call_at_its_vector_masks(case):
    g, lanes = case
    table, checked = planes.mask_table(g, lanes)
    entries = planes.mask_entries(g)
    bit_sets = table.reshape(-1, entries).view(np.uint32).astype(np.int64)
    registers = REGISTERS[lanes]
    per_call = planes.vectors_per_call(g, lanes, registers)
    offsets = planes.plane_offsets(g, lanes, registers)
    whole = planes.whole_plane_call(g, lanes, registers)
    if whole:
        # One call a plane, marked checked (its edge rows unread by its kernel).
        assert per_call == planes.output_vectors(g, lanes)
        checked = np.ones_like(checked)
    calls = planes.call_schedule(checked, per_call)
    assert offsets[0] == len(calls)
    taps = g.kernel_height * g.kernel_width
    for j, (v0, is_checked) in enumerate(calls):
        assert offsets[1 + 3 * j] == v0 and offsets[2 + 3 * j] == int(is_checked)
        at = offsets[3 + 3 * j]
        for u in range(per_call):
            for t in range(taps if is_checked else g.kernel_width):
                start = at + (u * (taps if is_checked else g.kernel_width) + t) * lanes
                vector = offsets[start : start + lanes]
                # A checked call reads each tap's mask, an unchecked one each column's.
                entry = 1 + g.kernel_width + t if is_checked else 1 + t
                bits = bit_sets[v0 + u, entry]
                expected = [-1 if bits >> lane & 1 else 0 for lane in range(lanes)]
                assert list(vector) == expected
    # Only the plane's last vector may be partial, and only the last call holds it.
    tail = planes.tail_lanes(g, lanes)
    assert tail == (g.out_height * g.out_width) % lanes
    if tail:
        assert calls[-1][1] and calls[-1][0] + per_call == planes.output_vectors(g, lanes)
    span = planes.load_span(g, lanes, registers)
    reach = (per_call - 1) * lanes + lanes + (g.kernel_height - 1) * g.dilation_h * g.width
    reach += (g.kernel_width - 1) * g.dilation_w
    if whole:
        # Whole vectors from the call's start, as far as any tap on the plane needs.
        assert span == planes.grid_vectors(g, lanes) * lanes
    else:
        assert span == reach
    # Every lane-vector mask starts a 64-byte line (once the launch puts the
    # table on one: tests/e2e/test_planes.py).
    aligned = min(lanes, planes.MASK_ALIGNMENT)
    assert all(offsets[3 + 3 * j] % aligned == 0 for j in range(len(calls)))


@settings(max_examples=60, deadline=None)
@given(plane_geometries())
def test_a_whole_plane_call_skips_masks_and_reaches_its_taps(case):
    g, lanes = case
    if not planes.whole_plane_call(g, lanes, REGISTERS[lanes]):
        return
    table, _ = planes.mask_table(g, lanes)
    bit_sets = table.reshape(-1, planes.mask_entries(g)).view(np.uint32).astype(np.int64)
    coverage = planes.tap_coverage(g, lanes)
    grid = planes.grid_vectors(g, lanes)
    for u, row in enumerate(coverage):
        stored = bit_sets[u, 0]
        for t, covered in enumerate(row):
            on_plane = bit_sets[u, 1 + g.kernel_width + t] & stored
            # 0: no stored lane on the plane; 1: every one; 2: some.
            assert covered == (0 if on_plane == 0 else 1 if on_plane == stored else 2)
            if covered:
                r, s = divmod(t, g.kernel_width)
                k, m = divmod(r * g.dilation_h * g.width + s * g.dilation_w, lanes)
                assert u + k + (1 if m else 0) < grid
    # The loaded vectors' masks clear exactly the lanes each tap may not read.
    keep = planes.grid_masks(g, lanes)
    for u, row in enumerate(coverage):
        for t, covered in enumerate(row):
            if not covered:
                continue  # not emitted (no stored lane on the plane, checked above)
            r, s = divmod(t, g.kernel_width)
            delta = r * g.dilation_h * g.width + s * g.dilation_w
            d = s * g.dilation_w - g.pad_left
            for lane in range(lanes):
                if not bit_sets[u, 0] >> lane & 1:
                    continue  # not stored
                source = u * lanes + lane + delta  # grid element, from the call's start
                kept = bool(keep[d][source // lanes][source % lanes])
                assert kept == bool(bit_sets[u, 1 + g.kernel_width + t] >> lane & 1)
    used = sum(1 for row in coverage for c in row if c)
    assert planes.whole_plane_loads(g, lanes) >= used
