"""cso: a CPU convolution compiler (SConv: convolution slicing analysis and optimisation).

>>> import numpy as np, cso
>>> x = np.ones((1, 3, 8, 8), np.float32); w = np.ones((4, 3, 3, 3), np.float32)
>>> cso.conv2d(x, w, padding=1).shape
(1, 4, 8, 8)
"""

import numba as _numba

# 'workqueue' aborts the process when two Python threads launch parallel
# kernels at once; 'threadsafe' picks TBB or OpenMP, both safe. Must be set
# before Numba's first parallel launch.
if _numba.config.THREADING_LAYER in ("default", "workqueue"):
    _numba.config.THREADING_LAYER = "threadsafe"

from . import reference  # noqa: E402
from .analysis.calibration_store import CalibrationWarning  # noqa: E402
from .analysis.choices import Schedule, VectorOperand  # noqa: E402
from .analysis.detect import detect_hardware  # noqa: E402
from .analysis.explain import explain  # noqa: E402
from .analysis.hardware import Hardware  # noqa: E402
from .analysis.plan import Plan  # noqa: E402
from .analysis.planner import plan_conv2d  # noqa: E402
from .analysis.weights import CostWeights  # noqa: E402
from ._version import __version__  # noqa: E402
from .conv import conv2d  # noqa: E402
from .packed import PackedFilters, pack_filters  # noqa: E402
from .packed_file import PackedFormatError, load_packed, save_packed  # noqa: E402
from .tune import TuneResult, tune  # noqa: E402
from .tuned_store import TunedPlans  # noqa: E402
from .workspace import release as release_workspace  # noqa: E402

__all__ = [
    "conv2d",
    "release_workspace",
    "plan_conv2d",
    "explain",
    "Plan",
    "Schedule",
    "VectorOperand",
    "Hardware",
    "CostWeights",
    "CalibrationWarning",
    "detect_hardware",
    "reference",
    "pack_filters",
    "PackedFilters",
    "PackedFormatError",
    "save_packed",
    "load_packed",
    "tune",
    "TuneResult",
    "TunedPlans",
    "__version__",
]
