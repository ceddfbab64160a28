"""Convolution slicing analysis: machine description, tile rules, cost model, plan.

Pure Python, no JIT: everything here is a function of its arguments, except
:mod:`.detect`, which reads this machine, and :mod:`.calibration_store`,
which reads what ``python -m cso calibrate`` measured on it.  The layers, each using only the
ones above it: :mod:`.choices` (the named choices), :mod:`.weights` and
:mod:`.hardware` (the machine), :mod:`.calibration` (weights from measured
rates) and :mod:`.calibration_store`, :mod:`.detect`, :mod:`.tiles` (the CSA
rules), :mod:`.counts` and :mod:`.cost` (the traffic model), :mod:`.plan` (the frozen plan),
:mod:`.planner` (the search) and :mod:`.explain` (the plan in words).
"""

from .choices import SCHEDULES, VECTOR_OPERANDS, Schedule, VectorOperand
from .cost import schedule_traffic
from .pricing import Traffic
from .hardware import DEFAULT_HARDWARE, Hardware
from .plan import Plan
from .planner import plan_conv2d
from .weights import DEFAULT_WEIGHTS, CostWeights

__all__ = [
    "Hardware",
    "DEFAULT_HARDWARE",
    "CostWeights",
    "DEFAULT_WEIGHTS",
    "Plan",
    "plan_conv2d",
    "Schedule",
    "SCHEDULES",
    "VectorOperand",
    "VECTOR_OPERANDS",
    "Traffic",
    "schedule_traffic",
]
