"""The calibration's rules for samples taken at several moments: each
program's quickest time is kept before the difference or the slope is
taken, so a pass in a slow minute of a shared machine moves nothing."""

import pytest

from cso.calibrate.loop_probes import input_pack_seconds, kernel_call_seconds


def test_input_packing_takes_each_programs_quickest_time():
    # (t_packing, t_skeleton, packed elements): the second sample ran in a
    # slow minute (packing 1.7x), the third had a slow skeleton round.
    samples = [(3.0e-3, 1.0e-3, 1000), (4.4e-3, 1.2e-3, 1000), (3.1e-3, 0.9e-3, 1000)]
    assert input_pack_seconds(samples) == pytest.approx((3.0e-3 - 0.9e-3) / 1000)


def test_input_packing_never_goes_negative():
    assert input_pack_seconds([(1.0e-3, 1.1e-3, 10)]) == 0.0


def test_kernel_call_slope_is_fitted_to_each_tiles_quickest_time():
    calls = [100, 200, 400, 800]
    quick = [1.0e-3 + c * 30e-9 for c in calls]
    slow = [t * 1.5 for t in quick]
    # One slow sample, one with a single slow tile: the slope is the quick one's.
    uneven = list(quick)
    uneven[-1] *= 1.3
    samples = [(calls, slow), (calls, quick), (calls, uneven)]
    assert kernel_call_seconds(samples) == pytest.approx(30e-9)
    assert kernel_call_seconds([(calls, slow)]) == pytest.approx(45e-9)
