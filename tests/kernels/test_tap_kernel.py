"""The depthwise tap kernel alone: its arithmetic against NumPy, and its
column loop kept rolled in the machine code."""

import re

import numba
import numpy as np
import pytest

from cso.analysis.detect import detect_hardware
from cso.microkernels.taps import build_tap_kernel

KERNEL_HEIGHT, COLUMNS = 3, 3


def _driver(rows, filters, lanes):
    kernel = build_tap_kernel(KERNEL_HEIGHT, 1, 1, rows, 1, "float32", lanes, 0, filters)

    @numba.njit
    def run(weights, offsets, inputs, width, out, out_pitch, filter_pitch, bias):
        kernel(
            COLUMNS, weights, 0, KERNEL_HEIGHT * COLUMNS, offsets, inputs, 0, width, out, 0,
            out_pitch, filter_pitch, lanes, bias, 0, 1, out, 0, 0, False,
        )  # fmt: skip

    return run


@pytest.mark.parametrize("filters", [1, 2])
def test_tap_kernel_matches_numpy_with_its_loop_rolled(filters):
    # A 3x3 filter at stride 1 over `rows` output rows of one vector: the
    # contract of cso.microkernels.taps with column offsets 0, 1, 2 and the
    # KCRS weights' r*S + s.
    lanes = detect_hardware().vector_bytes // 4
    rows = 4
    run = _driver(rows, filters, lanes)
    rng = np.random.default_rng(filters)
    width = lanes + COLUMNS - 1
    inputs = rng.standard_normal((rows + KERNEL_HEIGHT - 1) * width).astype(np.float32)
    weights = rng.standard_normal((filters, KERNEL_HEIGHT * COLUMNS)).astype(np.float32)
    bias = rng.standard_normal(filters).astype(np.float32)
    weight_offsets = [r * COLUMNS + t for r in range(KERNEL_HEIGHT) for t in range(COLUMNS)]
    offsets = np.array(list(range(COLUMNS)) + weight_offsets, dtype=np.intp)
    out_pitch, filter_pitch = lanes + 3, rows * (lanes + 3)
    out = np.full(filters * filter_pitch, 7.0, np.float32)
    run(weights.ravel(), offsets, inputs, width, out, out_pitch, filter_pitch, bias)

    planes = inputs.reshape(rows + KERNEL_HEIGHT - 1, width).astype(np.float64)
    for f in range(filters):
        expected = np.full((rows, lanes), float(bias[f]))
        for r in range(KERNEL_HEIGHT):
            for s in range(COLUMNS):
                expected += weights[f, r * COLUMNS + s] * planes[r : r + rows, s : s + lanes]
        got = out[f * filter_pitch :].reshape(-1, out_pitch)[:rows, :lanes]
        assert np.allclose(got, expected, rtol=1e-5, atol=1e-5)

    # The column loop does one column a pass: unrolled by LLVM (three
    # columns a pass), the AVX2 block kept a third of its accumulators on
    # the stack, and its layers ran 1.12x slower (Zen 3).
    assembly = next(iter(run.inspect_asm().values()))
    lines = assembly.splitlines()
    labels = {line.rstrip(":"): i for i, line in enumerate(lines) if re.match(r"^\.?L\w+:", line)}
    fmas_per_loop = []
    for end, line in enumerate(lines):
        jump = re.search(r"\bj\w+\s+(\.?L\w+)\b", line)
        if jump and labels.get(jump.group(1), end) < end:
            body = lines[labels[jump.group(1)] : end + 1]
            if any("vfmadd" in text for text in body):
                fmas_per_loop.append(sum("vfmadd" in text for text in body))
    assert fmas_per_loop == [filters * rows * KERNEL_HEIGHT], fmas_per_loop
