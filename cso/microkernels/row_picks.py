"""Which loaded elements the row kernel's stride-2 taps take, and in what
order (:mod:`.row_taps`): every other element of two loaded vectors, picked
by one in-chunk shuffle, and the one shuffle that puts the sums back in
output-column order.

Column ``m`` of a call (before :func:`natural_order`) takes, at phase
``t``, position ``2m + t`` of the two loaded vectors side by side: so the
columns ``[a, b)`` of a call read positions ``[2a, 2b)``, which lets the
filters a row-kernel vector holds side by side
(:func:`cso.analysis.plane_shapes.filters_per_vector`) each load their own
span of positions.
"""

from __future__ import annotations


# The chunk of a vector register within which one shuffle instruction of two
# sources moves elements (x86's 128-bit lanes; all of a NEON register).
SHUFFLE_CHUNK_BYTES = 16


def in_chunk_picks(lanes: int, element_bytes: int, phase: int) -> list:
    """The ``phase``-th of every 2 elements of two concatenated vectors
    ``(a, b)``, in the order one in-chunk shuffle gives them.

    Chunk ``k`` of the result (``E = 16 / element_bytes`` elements) holds
    ``a``'s picks from its chunk ``k``, then ``b``'s: ``[a0 a2 b0 b2 | a4 a6
    b4 b6]`` for 8 floats, one ``vshufps``, where the natural order ``[a0 a2
    a4 a6 b0 b2 b4 b6]`` takes a ``vshufps`` and a cross-chunk permute.
    Every tap's vector comes out in this same order, so the sums do too and
    :func:`natural_order` puts them back once, before they are stored: on an
    AMD EPYC (Zen 3) stride-2 row layers ran 1.11-1.16x faster so (``dw
    3x3/2`` at 96 channels @112, 144 @56 and 8 @112, against the natural
    order's two instructions a tap, in paired rounds of one process).
    """
    chunk = max(1, SHUFFLE_CHUNK_BYTES // element_bytes)
    if lanes <= chunk:
        return [phase + 2 * i for i in range(lanes)]
    half = chunk // 2
    picks = []
    for position in range(lanes):
        k, j = divmod(position, chunk)
        source = k * chunk + 2 * j if j < half else lanes + k * chunk + 2 * (j - half)
        picks.append(source + phase)
    return picks


def natural_order(lanes: int, element_bytes: int) -> list:
    """The shuffle putting a vector in :func:`in_chunk_picks`' order back in
    output-column order: element ``q`` is taken from the position holding
    output column ``q``."""
    # Pick 2m of the concatenated pair (a's m-th pair, or b's) is column m.
    columns = [pick // 2 for pick in in_chunk_picks(lanes, element_bytes, 0)]
    return [columns.index(q) for q in range(lanes)]
