"""Convolution slicing analysis: hardware description, tile rules, cost model, plan.

Pure Python, no JIT: everything here is a function of its arguments.
"""

from .cost import Traffic, schedule_traffic
from .hardware import DEFAULT_HARDWARE, Hardware
from .plan import SCHEDULES, Plan, plan_conv2d

__all__ = [
    "Hardware",
    "DEFAULT_HARDWARE",
    "Plan",
    "plan_conv2d",
    "SCHEDULES",
    "Traffic",
    "schedule_traffic",
]
