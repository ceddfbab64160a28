"""The benchmark's torch peer runs on the thread count it was given."""

import numpy as np
import pytest

import cso
from cso.measure import torch_peer


def test_torch_peer_keeps_its_thread_count_after_cso_parallel_regions():
    torch = pytest.importorskip("torch")
    run = torch_peer(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 9, 9), dtype=np.float32)
    w = rng.standard_normal((8, 4, 3, 3), dtype=np.float32)
    run(x, w, 1, 1)  # torch's OpenMP pool starts, as in the bench's warm-up
    # A parallel region on all of Numba's threads, as the bench runs before torch.
    expected = cso.conv2d(x, w, padding=1)
    result = run(x, w, 1, 1).numpy()
    assert torch.get_num_threads() == 1
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
