"""First-call time of cso.conv2d: cold (empty kernel cache) and warm (cached on disk).

Each measurement is a fresh process, so it includes importing cso and Numba.
Usage: python experiments/first_call.py
"""

import os
import subprocess
import sys
import tempfile

import harness

PROGRAM = """
import time
start = time.perf_counter()
import numpy as np, cso
imported = time.perf_counter()
x = np.ones((1, 64, 56, 56), np.float32); w = np.ones((64, 64, 3, 3), np.float32)
cso.conv2d(x, w, padding=1)
first = time.perf_counter()
cso.conv2d(x, w, padding=1)
second = time.perf_counter()
print(f"{imported - start:.2f} {first - imported:.2f} {second - first:.4f}")
"""


def measure(cache_dir, numba_cache_dir):
    env = dict(os.environ, CSO_CACHE_DIR=cache_dir, NUMBA_CACHE_DIR=numba_cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return [float(v) for v in out]


def main():
    harness.parser(__doc__).parse_args()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as numba_cache:
        for label in ("cold", "warm", "warm"):
            imported, first, second = measure(cache, numba_cache)
            print(
                f"{label}: import {imported:.2f} s, first call {first:.2f} s, "
                f"second call {second * 1e3:.1f} ms"
            )


if __name__ == "__main__":
    main()
