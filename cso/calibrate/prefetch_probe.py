"""Does the dense micro-kernels' software prefetch pay on this machine?

:func:`prefetch_speedup` times three layers' plans with the kernels'
prefetch (``Hardware.kernel_prefetch_distance``'s default) and without it
(:data:`cso.measure.VARIANTS`' ``no-prefetch``), in paired rounds; the
calibration keeps the faster way
(:func:`~cso.analysis.calibration.kernel_prefetch_distance`).
"""

from __future__ import annotations

from statistics import median

import numpy as np

from .. import plan_conv2d
from ..measure import paired_ratios, plan_program, round_times
from .loop_probes import MIN_SECONDS

# ResNet-50's `conv1`, `l1 3x3 64 @56` and `l2 1x1 256->128 @56`, whose
# panels stream from L2 through the most kernel calls: on a Xeon its layers
# ran 2-9% slower without the prefetch; on an AMD EPYC (Zen 3) these 5-18%
# faster, ResNet-50 in all 3-5% (`experiments/variants.py --variant
# no-prefetch`, four runs), its 14x14 and 7x7 layers by -4% to +12%.
PREFETCH_LAYERS = (
    ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ((1, 256, 56, 56), (128, 256, 1, 1), 1, 0),
)


def prefetch_speedup(hardware, rounds=7) -> float:
    """``median(t_without / t_with)`` over :data:`PREFETCH_LAYERS` and the
    paired rounds (:func:`cso.measure.paired_ratios`): above 1 the prefetch
    pays.  The plans are ``hardware``'s (its default weights), one thread."""
    ratios = []
    rng = np.random.default_rng(0)
    for x_shape, w_shape, stride, padding in PREFETCH_LAYERS:
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal(w_shape, dtype=np.float32)
        plan = plan_conv2d(
            x_shape, w_shape, stride=stride, padding=padding, threads=1, hardware=hardware,
            algorithm="dense",
        )
        programs = {
            "with": plan_program(plan, x, w),
            "without": plan_program(plan, x, w, variant="no-prefetch"),
        }
        samples = round_times(programs, rounds, MIN_SECONDS)
        ratios.append(paired_ratios(samples, "without")["with"])
    return median(ratios)
