"""The named choices a plan makes: the schedule and the micro-kernel's vector operand.

Both are ``str`` enums, so a member equals (and hashes like) its value:
``Schedule.IS == "IS"``, and JSON writes it as ``"IS"``.  Users may pass
either; the analysis converts with :func:`parse_choice`, which names the
parameter and the values allowed when it fails.
"""

from __future__ import annotations

from enum import Enum


class _Choice(str, Enum):
    """A ``str`` enum printed as its value (``f"{Schedule.IS}"`` is ``"IS"``)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Schedule(_Choice):
    """Which operand a cache-tiling loop nest keeps resident.

    ``IS`` (input-stationary) keeps packed input tiles and streams the
    filters; ``WS`` (weight-stationary) keeps filter tiles and streams the
    input.
    """

    IS = "IS"
    WS = "WS"


class VectorOperand(_Choice):
    """What fills the micro-kernel's vector registers.

    ``WINDOWS``: output windows (the SConv kernel, ``Nwin`` a multiple of the
    lanes, filters broadcast); ``FILTERS``: output filters (``Nf`` a multiple
    of the lanes, every filter packed); ``REDUCTION``: the reduction (dot
    products, for a window that is the whole unpadded input).
    """

    WINDOWS = "windows"
    FILTERS = "filters"
    REDUCTION = "reduction"


class Algorithm(_Choice):
    """The algorithm family a plan runs.

    ``DENSE``: packed input tiles times filter tiles in the outer-product
    micro-kernel, under the IS or WS cache-tiling nest (groups one after
    another).  ``DEPTHWISE``: one input channel per group; each channel is
    packed once and its taps applied to row segments held in vector
    registers (the tap micro-kernel).  ``GROUPED``: a few input channels
    per group, run by the same tap kernel and nest, each call applying the
    taps of all the group's channels (no ``R*S``-fold window expansion).
    ``DEPTHWISE_LANES``: depthwise with channel multiplier 1, a block of
    vector-lanes channels at a time, each vector one pixel of them (the
    lane tap kernel, :mod:`cso.analysis.lanes`).  ``DEPTHWISE_PLANES``:
    depthwise at stride 1 with ``Q == W``, runs of output pixels of one
    plane computed from the unpacked input by shifted, masked loads (the
    plane tap kernel, :mod:`cso.analysis.planes`).  ``DEPTHWISE_ROWS``:
    depthwise at horizontal stride 1 or 2, runs of one output row computed
    from the unpacked input (the row tap kernel, :mod:`cso.analysis.rows`).
    ``WINOGRAD``: dense 3x3 at stride 1 as F(2x2, 3x3): 16 products of
    transformed filters and transformed 4x4 input tiles on the
    outer-product micro-kernel, 2.25x fewer multiply-adds
    (:mod:`cso.analysis.winograd`).
    """

    DENSE = "dense"
    DEPTHWISE = "depthwise"
    GROUPED = "grouped"
    DEPTHWISE_LANES = "depthwise_lanes"
    DEPTHWISE_PLANES = "depthwise_planes"
    DEPTHWISE_ROWS = "depthwise_rows"
    WINOGRAD = "winograd"


# The families the tap kernel and its nest (cso.macrokernel.depthwise) run.
TAP_ALGORITHMS = frozenset((Algorithm.DEPTHWISE, Algorithm.GROUPED))

# The families that read the filters as KCRS rows, in place (packed ahead
# of time, the rows are the panel).
KCRS_ALGORITHMS = TAP_ALGORITHMS | {
    Algorithm.DEPTHWISE_LANES,
    Algorithm.DEPTHWISE_PLANES,
    Algorithm.DEPTHWISE_ROWS,
    Algorithm.WINOGRAD,  # KCRS per call; packed ahead, its transformed filters instead
}


class Activation(_Choice):
    """The activation a fused epilogue applies after the bias and the residual.

    As PyTorch defines them: ``relu`` max(x, 0); ``relu6`` min(max(x, 0), 6);
    ``sigmoid`` 1 / (1 + exp(-x)); ``silu`` x * sigmoid(x); ``hardsigmoid``
    min(max(x / 6 + 1/2, 0), 1); ``hardswish`` x * hardsigmoid(x); ``gelu``
    x * (1 + erf(x / sqrt(2))) / 2 (the exact form, not the tanh one).
    """

    RELU = "relu"
    RELU6 = "relu6"
    SIGMOID = "sigmoid"
    SILU = "silu"
    HARDSWISH = "hardswish"
    HARDSIGMOID = "hardsigmoid"
    GELU = "gelu"


def activation_code(activation) -> int:
    """The number the kernels know ``activation`` by: 0 for None, else its
    place in :class:`Activation`, from 1 (a ``ValueError`` naming
    ``activation`` and the choices for anything else)."""
    member = parse_choice(Activation, activation, "activation")
    return 0 if member is None else ACTIVATIONS.index(member) + 1


SCHEDULES = tuple(Schedule)
ACTIVATIONS = tuple(Activation)
VECTOR_OPERANDS = tuple(VectorOperand)


def parse_choice(kind, value, name: str):
    """``value`` as a member of the enum ``kind``, or None for None.

    Raises
    ------
    ValueError
        Naming ``name`` and the allowed values, for anything else.
    """
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise ValueError(f"{name} must be one of {allowed} or None, got {value!r}") from None
