"""Bad input: a clear error naming the parameter, raised before any work."""

import threading

import numba
import numpy as np
import pytest
from conftest import assert_matches_reference

import cso
from cso import workspace

X = np.ones((1, 4, 8, 8), np.float32)
W = np.ones((6, 4, 3, 3), np.float32)


@pytest.mark.parametrize(
    "args, kwargs, error, pattern",
    [
        ((np.ones((4, 8, 8)), W), {}, ValueError, "x must be 4-D"),
        ((X, np.ones((6, 4, 3))), {}, ValueError, "w must be 4-D"),
        ((X, np.ones((6, 3, 3, 3))), {}, ValueError, r"w.shape\[1\]"),
        ((X.astype(np.complex64), W), {}, TypeError, "x must have a real numeric dtype"),
        ((X, W.astype(bool)), {}, TypeError, "w must have a real numeric dtype"),
        ((X.astype(object), W), {}, TypeError, "x must have a real numeric dtype"),
        ((X, W), dict(bias=np.ones(5)), ValueError, r"bias must have shape \(6,\)"),
        ((X, W), dict(bias=np.ones(6, complex)), TypeError, "bias"),
        ((X, W), dict(stride=0), ValueError, "stride must be >= 1"),
        ((X, W), dict(padding=-1), ValueError, "padding must be >= 0"),
        ((X, W), dict(padding="bogus"), ValueError, "padding must be"),
        ((X, W), dict(dilation=(1, 0)), ValueError, r"dilation\[1\]"),
        ((X, W), dict(groups=3), ValueError, "groups"),
        ((X, W), dict(dilation=5), ValueError, "smaller than the dilated kernel"),
        ((X, W), dict(threads=0), ValueError, "threads must be between 1 and"),
        ((X, W), dict(threads=10_000), ValueError, "threads must be between 1 and"),
        ((X, W), dict(threads=1.5), TypeError, "threads"),
        ((X, W), dict(out=np.empty((1, 6, 6, 6), np.float64)), ValueError, "out must have shape"),
        ((X, W), dict(out=np.empty((1, 6, 6, 7), np.float32)), ValueError, "out must have shape"),
        (
            (X, W),
            dict(out=np.empty((1, 6, 6, 12), np.float32)[..., ::2]),
            ValueError,
            "C-contiguous",
        ),
        ((X, W), dict(out=[0]), TypeError, "out must be a numpy.ndarray"),
        ((X, W), dict(plan="IS"), TypeError, "plan must be a cso.Plan"),
        (([[1, 2], [3]], W), {}, TypeError, "x must be array-like"),
    ],
)
def test_bad_input_names_the_parameter(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        cso.conv2d(*args, **kwargs)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(stride=True), TypeError, "stride must be an integer, got bool"),
        (dict(stride=(1, True)), TypeError, r"stride\[1\] must be an integer"),
        (dict(threads=True), TypeError, "threads must be an int or None"),
        (dict(bias=np.ones(5, np.float32)), ValueError, r"bias must have shape \(6,\)"),
        (dict(bias=np.ones(6, complex)), TypeError, "bias"),
        (dict(padding=(1, 1, 1)), ValueError, "padding"),
    ],
)
def test_a_call_validated_before_does_not_let_a_bad_one_through(kwargs, error, pattern):
    # The call's checks are memoised by shapes, dtypes and parameters: a bad
    # parameter that compares equal to a good one (True == 1) still raises.
    good = dict(stride=1, threads=1, bias=np.ones(6, np.float32), padding=1)
    cso.conv2d(X, W, **good)
    with pytest.raises(error, match=pattern):
        cso.conv2d(X, W, **dict(good, **kwargs))


def test_plan_for_another_problem_is_refused():
    plan = cso.plan_conv2d((1, 4, 9, 9), W.shape)
    with pytest.raises(ValueError, match="plan was made for another problem"):
        cso.conv2d(X, W, plan=plan)
    plan64 = cso.plan_conv2d(X.shape, W.shape, dtype=np.float64)
    with pytest.raises(ValueError, match="another problem"):
        cso.conv2d(X, W, plan=plan64)


def test_out_overlapping_the_input_is_refused():
    buffer = np.ones((1, 6, 6, 6), np.float32)
    x = buffer[:, :4]
    out = buffer.reshape(-1)[:96].reshape(1, 6, 4, 4)
    with pytest.raises(ValueError, match="overlap"):
        cso.conv2d(x, W, out=out)


def test_concurrent_calls_from_six_threads(rng):
    # Dense and depthwise problems (the latter's repeated calls through their
    # compiled quick call), one and two threads each: every parallel launch
    # opens its own region from its own calling thread.
    problems = []
    for index in range(6):
        channels = 8 + index
        groups = channels if index >= 2 else 1
        x = rng.standard_normal((1, channels, 20, 17)).astype(np.float32)
        filters = channels if groups > 1 else 12 + index
        w = rng.standard_normal((filters, channels // groups, 3, 3)).astype(np.float32)
        problems.append((x, w, groups))
    results, errors = {}, []

    def work(index):
        try:
            x, w, groups = problems[index]
            for _ in range(5):
                results[index] = cso.conv2d(
                    x, w, padding=1, groups=groups, threads=1 + index % 2
                )
        except Exception as error:  # surfaced below, not swallowed
            errors.append(error)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    for index, (x, w, groups) in enumerate(problems):
        assert_matches_reference(results[index], x, w, padding=1, groups=groups)


def test_a_kept_workspace_left_full_by_another_layer_does_not_change_a_result(rng):
    # A large layer leaves its packed panels in this thread's workspace; a
    # padded layer with edge tiles run next must see none of them.
    big_x = rng.standard_normal((1, 48, 30, 30)).astype(np.float32)
    big_w = rng.standard_normal((40, 48, 3, 3)).astype(np.float32)
    x = rng.standard_normal((2, 5, 9, 11)).astype(np.float32)
    w = rng.standard_normal((11, 5, 3, 2)).astype(np.float32)
    workspace.release()
    alone = cso.conv2d(x, w, padding=(2, 1), threads=1)
    cso.conv2d(big_x, big_w, padding=1, threads=1)
    after = cso.conv2d(x, w, padding=(2, 1), threads=1)
    np.testing.assert_array_equal(after, alone)
    assert_matches_reference(after, x, w, padding=(2, 1))


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs a pool of two threads")
def test_threads_above_this_threads_numba_count_are_used_and_the_count_restored(rng):
    x = rng.standard_normal((2, 6, 15, 21)).astype(np.float32)
    w = rng.standard_normal((20, 6, 3, 3)).astype(np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        y = cso.conv2d(x, w, padding=1, threads=2)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
    assert_matches_reference(y, x, w, padding=1)
