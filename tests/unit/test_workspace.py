"""The loop nests' kept scratch memory (pure NumPy, no JIT)."""

import threading

import numpy as np
import pytest

from cso import workspace


@pytest.fixture(autouse=True)
def fresh():
    workspace.release()
    yield
    workspace.release()


def test_consecutive_calls_on_one_thread_get_the_same_memory():
    first = workspace.workspace(1000, np.float32)
    second = workspace.workspace(600, np.float32)
    assert second.size == 600 and second.dtype == np.float32
    assert second.ctypes.data == first.ctypes.data


def test_a_larger_request_grows_the_buffer_and_new_memory_is_zeroed():
    small = workspace.workspace(100, np.float32)
    small[:] = 7.0
    large = workspace.workspace(100_000, np.float32)
    assert large.size == 100_000
    assert not np.shares_memory(small, large)
    assert np.all(large == 0.0)
    assert workspace.workspace(50_000, np.float32).ctypes.data == large.ctypes.data


def test_buffers_start_on_a_cache_line_and_are_kept_per_dtype():
    single = workspace.workspace(33, np.float32)
    double = workspace.workspace(33, np.float64)
    assert single.ctypes.data % 64 == 0 and double.ctypes.data % 64 == 0
    assert double.dtype == np.float64 and not np.shares_memory(single, double)


def test_each_python_thread_has_its_own_buffer():
    buffers = {}

    def work(name):
        # Kept here (alive), so that no thread's memory is freed and reused.
        buffers[name] = workspace.workspace(4096, np.float32)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    here = workspace.workspace(4096, np.float32)
    addresses = {b.ctypes.data for b in buffers.values()} | {here.ctypes.data}
    assert len(addresses) == 4


def test_a_buffer_over_the_keep_limit_is_not_kept():
    elements = workspace.KEEP_LIMIT_BYTES // 4 + 16
    big = workspace.workspace(elements, np.float32)
    assert big.size == elements
    again = workspace.workspace(16, np.float32)
    assert not np.shares_memory(big, again)


@pytest.mark.parametrize(
    ("elements", "dtype", "stride"),
    [
        (1, np.float32, 16),
        (16, np.float32, 16),
        (17, np.float32, 32),
        (9, np.float64, 16),
        (0, np.float32, 0),
    ],
)
def test_worker_stride_rounds_up_to_whole_cache_lines(elements, dtype, stride):
    assert workspace.worker_stride(elements, dtype) == stride


def test_the_public_release_drops_this_threads_buffer():
    import cso

    kept = workspace.workspace(256, np.float32)
    cso.release_workspace()
    assert not np.shares_memory(kept, workspace.workspace(256, np.float32))

