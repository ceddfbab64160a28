"""How a dense plan gets its input, for :mod:`.explain_dense`: the kind of
packing and its weight per element, and, for a 1x1 layer whose input may be
read in place, the cost of that way against the other."""

from __future__ import annotations

from . import candidates, counts
from .choices import VectorOperand


def input_pack_kind(plan) -> str:
    g = plan.geometry
    return counts.input_pack_kind(g.kernel_height, g.kernel_width, g.stride_w)


def input_pack_cost(plan) -> float:
    """``c_input`` of the plan's kind of input packing at its output width
    (``CostWeights.input_pack_cost_of``)."""
    return plan.hardware.weights.input_pack_cost_of(input_pack_kind(plan), plan.geometry.out_width)


def input_pack_story(plan) -> str:
    kind = input_pack_kind(plan)
    weights = plan.hardware.weights
    measured = any(name == kind for name, _ in weights.input_pack_costs)
    where = "this kind's, calibrated" if measured else "the weights' input_pack_cost"
    row = dict(weights.input_pack_row_costs).get(kind)
    if row is not None:
        base = weights.input_pack_cost_of(kind)
        where += f": {base:.3g} + {row:.3g} / {plan.geometry.out_width} output columns"
    return f"input packing: {kind}, c_input {input_pack_cost(plan):.3g} per element ({where})"


def input_way_story(plan):
    """Whether the input is read in place or packed, against the other way
    with the same tiles; None where the layer's input cannot be read in
    place, or a dot-product kernel's must be
    (:func:`~cso.analysis.candidates.input_ways`)."""
    problem = candidates.problem_of(plan)
    if plan.vector_operand == VectorOperand.REDUCTION or not candidates.input_read_in_place(
        plan.geometry, plan.vector_operand, problem.element_bytes, plan.hardware
    ):
        return None
    choice = candidates.TileChoice(
        plan.schedule, plan.channel_tile, plan.l2_tiles, plan.l3_tiles, plan.window_parts
    )
    other = candidates.traffic(
        problem._replace(input_in_place=not plan.input_in_place),
        plan.filters_per_tile, plan.windows_per_tile, choice,
    )  # fmt: skip
    chosen = plan.cost_of(plan.schedule)
    reads = chosen.in_place_input_reads or other.in_place_input_reads
    row_bytes = plan.geometry.height * plan.geometry.width * problem.element_bytes
    way = "read in place from x" if plan.input_in_place else "packed into panels"
    rival = "packing it" if plan.input_in_place else "reading it in place"
    return (
        f"input {way} (channel rows {row_bytes} B apart): modelled cost {chosen.cost:.3g} "
        f"against {other.cost:.3g} {rival} with these tiles; {reads} reads in place at "
        f"c_in_place_input {plan.hardware.weights.in_place_input_cost:.3g}"
    )
