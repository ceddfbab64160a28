"""The stride-2 row kernel's shuffles: picks within 16-byte chunks, and the
permutation that puts the sums back in column order."""

import numpy as np
import pytest

from cso.microkernels.row_picks import SHUFFLE_CHUNK_BYTES, in_chunk_picks, natural_order

# (lanes, element bytes) of every vector width cso plans for: NEON / SSE,
# AVX2 and AVX-512, float32 and float64.
WIDTHS = [(4, 4), (2, 8), (8, 4), (4, 8), (16, 4), (8, 8)]


@pytest.mark.parametrize("lanes, element_bytes", WIDTHS)
@pytest.mark.parametrize("phase", [0, 1])
def test_picks_put_back_in_order_are_every_other_column(lanes, element_bytes, phase):
    pair = np.arange(2 * lanes)  # two loaded vectors, columns 0 .. 2*lanes-1
    shuffled = pair[in_chunk_picks(lanes, element_bytes, phase)]
    assert list(shuffled[natural_order(lanes, element_bytes)]) == list(range(phase, 2 * lanes, 2))


@pytest.mark.parametrize("lanes, element_bytes", WIDTHS)
def test_each_chunk_of_the_result_reads_the_same_chunk_of_each_source(lanes, element_bytes):
    # What makes the pick one in-chunk instruction (vshufps / vshufpd / uzp).
    chunk = SHUFFLE_CHUNK_BYTES // element_bytes
    for phase in (0, 1):
        picks = in_chunk_picks(lanes, element_bytes, phase)
        for position, pick in enumerate(picks):
            source_position = pick % lanes
            assert source_position // chunk == position // chunk or lanes <= chunk


@pytest.mark.parametrize("lanes, element_bytes", WIDTHS)
def test_every_tap_shares_one_order(lanes, element_bytes):
    # The sums are put back once: the two phases must place a column alike.
    even = [pick // 2 for pick in in_chunk_picks(lanes, element_bytes, 0)]
    odd = [(pick - 1) // 2 for pick in in_chunk_picks(lanes, element_bytes, 1)]
    assert even == odd and sorted(even) == list(range(lanes))
