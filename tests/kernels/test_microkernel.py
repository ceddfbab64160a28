"""The generated outer-product micro-kernel against NumPy, and its machine code."""

import re

import numba
import numpy as np
import pytest

from cso.analysis.choices import activation_code
from cso.microkernels.outer_product import build_outer_product_kernel
from conftest import activate, activation_bound

SHAPES = [
    (14, 32, "float32", 16, "windows"),
    (14, 16, "float64", 8, "windows"),
    (6, 16, "float32", 8, "windows"),
    (3, 48, "float32", 16, "windows"),
    (32, 14, "float32", 16, "filters"),
    (32, 7, "float32", 16, "filters"),
    (16, 5, "float64", 8, "filters"),
    (48, 1, "float32", 16, "filters"),
    # Windows past one vector: a full block of VL transposed, then a partial one.
    (16, 20, "float32", 16, "filters"),
    (8, 16, "float64", 8, "filters"),
]


def _driver(nf, nwin, dtype_name, lanes, vector_operand="windows"):
    kernel = build_outer_product_kernel(nf, nwin, dtype_name, lanes, vector_operand)

    # The intrinsic is callable only from jitted code: a pass-through of its 19
    # arguments, the last four (the epilogue) none by default.
    @numba.njit
    def run(*args):
        kernel(*args)

    def call(*args, residual=None, residual_offset=0, activation=None):
        has_residual = residual is not None
        if residual is None:
            residual = np.zeros(1, args[8].dtype)
        run(*args, residual, residual_offset, activation_code(activation), has_residual)

    call.inspect_asm = run.inspect_asm
    return call


@pytest.mark.parametrize("nf, nwin, dtype_name, lanes, vector_operand", SHAPES)
def test_kernel_matches_numpy(nf, nwin, dtype_name, lanes, vector_operand):
    run = _driver(nf, nwin, dtype_name, lanes, vector_operand)
    rng = np.random.default_rng(nf * nwin)
    dtype = np.dtype(dtype_name)
    # A filter-vectorised kernel loads filter rows as vectors: packed panels only.
    layouts = ("packed", "in_place") if vector_operand == "windows" else ("packed",)
    for depth in (0, 1, 7, 64):
        for layout in layouts:
            a = rng.standard_normal(5 + depth * nf).astype(dtype)
            if layout == "packed":  # [depth][Nf], strides (Nf, 1)
                matrix_a, k_stride, i_stride = a[5:].reshape(depth, nf), nf, 1
            else:  # [Nf][depth], strides (1, depth)
                matrix_a, k_stride, i_stride = a[5:].reshape(nf, depth).T, 1, depth
            b_stride = nwin + 3  # a row stride that is not Nwin, as in-place inputs have
            b = rng.standard_normal(2 + depth * b_stride).astype(dtype)
            matrix_b = b[2:].reshape(depth, b_stride)[:, :nwin] if depth else np.zeros((0, nwin))
            c_stride = nwin + 5
            c = rng.standard_normal(1 + nf * c_stride).astype(dtype)
            old = c[1:].reshape(nf, c_stride)[:, :nwin].astype(np.float64)
            bias = rng.standard_normal(nf + 2).astype(dtype)
            product = matrix_a.astype(np.float64).T @ matrix_b.astype(np.float64)
            tolerance = (
                4
                * (depth + 2)
                * np.finfo(dtype).eps
                * (np.abs(matrix_a).T @ np.abs(matrix_b) + np.abs(old) + np.abs(bias[2:, None]) + 1)
            )
            residual = rng.standard_normal(3 + nf * c_stride).astype(dtype)
            residual_tile = residual[3:].reshape(nf, c_stride)[:, :nwin].astype(np.float64)
            cases = [
                (True, False, None, False),
                (False, True, None, False),
                (False, False, None, False),
                (True, True, None, False),
                (True, True, "relu", True),
                (False, True, "silu", True),
                (True, False, "hardswish", False),
                (False, False, "gelu", True),
            ]
            for overwrite, add_bias, activation, with_residual in cases:
                out = c.copy()
                epilogue = {"activation": activation}
                if with_residual:
                    epilogue.update(residual=residual, residual_offset=3)
                run(
                    depth,
                    a,
                    5,
                    k_stride,
                    i_stride,
                    b,
                    2,
                    b_stride,
                    out,
                    1,
                    c_stride,
                    bias,
                    2,
                    overwrite,
                    add_bias,
                    **epilogue,
                )
                tile = out[1:].reshape(nf, c_stride)
                expected = product + (0 if overwrite else old) + (bias[2:, None] if add_bias else 0)
                bound = tolerance
                if with_residual:
                    expected = expected + residual_tile
                    bound = bound + np.finfo(dtype).eps * np.abs(residual_tile)
                if activation is not None:
                    bound = activation_bound(expected, bound, dtype)
                    expected = activate(activation, expected)
                assert np.all(np.abs(tile[:, :nwin] - expected) <= bound), (activation, overwrite)
                # Nothing outside the tile is touched.
                assert np.array_equal(tile[:, nwin:], c[1:].reshape(nf, c_stride)[:, nwin:])
                assert out[0] == c[0]


@pytest.mark.parametrize("nf, nwin, vector_operand", [(14, 32, "windows"), (32, 7, "filters")])
def test_overwrite_ignores_stale_nan(nf, nwin, vector_operand):
    run = _driver(nf, nwin, "float32", 16, vector_operand)
    a = np.ones(nf * 2, np.float32)
    b = np.ones(2 * nwin, np.float32)
    c = np.full(nf * nwin, np.nan, np.float32)
    run(2, a, 0, nf, 1, b, 0, nwin, c, 0, nwin, np.zeros(nf, np.float32), 0, True, False)
    assert np.all(c == 2.0)


def test_kernel_rejects_wrong_dtype():
    run = _driver(14, 32, "float32", 16)
    a64 = np.ones(14, np.float64)
    with pytest.raises((TypeError, numba.core.errors.TypingError), match="float32"):
        run(
            1,
            a64,
            0,
            14,
            1,
            np.ones(32, np.float32),
            0,
            32,
            np.ones(14 * 32, np.float32),
            0,
            32,
            np.zeros(14, np.float32),
            0,
            True,
            False,
        )


def test_bad_shape_is_refused():
    with pytest.raises(ValueError, match="windows_per_tile .* multiple of"):
        build_outer_product_kernel(14, 20, "float32", 16)
    with pytest.raises(ValueError, match="filters_per_tile .* multiple of"):
        build_outer_product_kernel(14, 32, "float32", 16, "filters")
    with pytest.raises(ValueError, match="vector_operand"):
        build_outer_product_kernel(14, 32, "float32", 16, "channels")
    with pytest.raises(ValueError, match="dtype_name"):
        build_outer_product_kernel(14, 32, "float16", 16)


def _fma_loop(assembly):
    """The lines of the loop that holds the FMAs: from its label to the jump back."""
    lines = assembly.splitlines()
    first_fma = next(i for i, line in enumerate(lines) if "vfmadd" in line)
    start = max(i for i in range(first_fma) if re.match(r"^\.?L\w+:", lines[i]))
    label = lines[start].rstrip(":")
    end = next(
        i
        for i in range(first_fma, len(lines))
        if re.search(r"\bj\w+\s+" + re.escape(label) + r"\b", lines[i])
    )
    return lines[start : end + 1]


def _offered_shapes():
    """``[(Nf, Nwin, dtype, lanes, operand)]``: every shape the planner offers
    this machine in float32 (the calibration's list), and its widest in float64."""
    from cso.analysis import tiles
    from cso.analysis.detect import detect_hardware
    from cso.calibrate.kernel_probes import planner_shapes

    hardware = detect_hardware()
    lanes = hardware.vector_bytes // 4
    found = [
        (nf, nwin, "float32", lanes, operand)
        for nf, nwin, operand in planner_shapes(hardware.vector_bytes, hardware.vector_registers)
    ]
    nf, nwin = tiles.register_blocks(hardware.vector_bytes, hardware.vector_registers, 8)[0]
    return found + [(nf, nwin, "float64", lanes // 2, "windows")]


@pytest.mark.parametrize("nf, nwin, dtype_name, lanes, vector_operand", _offered_shapes())
def test_inner_loop_has_no_spills(nf, nwin, dtype_name, lanes, vector_operand):
    """The reduction loop is one step, rolled, and touches no stack.

    Unrolled by LLVM, the AVX2 8 x 8 kernel called alone in a loop
    (experiments/kernel_ceiling.py) kept one accumulator on the stack (a
    store and a reload in its dependency chain every two steps) and ran at
    45% of the FMA peak on a Zen 3, 85% rolled; inlined in the loop nests,
    where the unrolled code had kept 0-1 values on the stack, the rolled
    loop makes the kernel's code the same whatever surrounds it.
    """
    run = _driver(nf, nwin, dtype_name, lanes, vector_operand)
    dtype = np.dtype(dtype_name)
    a, b, c = np.ones(nf, dtype), np.ones(nwin, dtype), np.ones(nf * nwin, dtype)
    run(1, a, 0, nf, 1, b, 0, nwin, c, 0, nwin, np.zeros(nf, dtype), 0, True, False)
    assembly = next(iter(run.inspect_asm().values()))
    loop = _fma_loop(assembly)
    vectors = (nwin if vector_operand == "windows" else nf) // lanes
    broadcasts = nf if vector_operand == "windows" else nwin
    assert sum("vfmadd" in line for line in loop) == broadcasts * vectors
    # No spill or reload: nothing in the loop touches the stack.
    assert [line for line in loop if re.search(r"\((%rsp|%rbp)", line)] == []


@pytest.mark.parametrize(
    "nf, nwin, dtype_name, lanes",
    [(8, 1, "float32", 16), (3, 2, "float64", 8), (5, 3, "float32", 16)],
)
def test_dot_product_kernel_matches_numpy(nf, nwin, dtype_name, lanes):
    """Reduction orientation: rows of filters and rows of windows, both
    contiguous along the reduction, any depth (the last step is masked)."""
    kernel = build_outer_product_kernel(nf, nwin, dtype_name, lanes, "reduction")

    @numba.njit
    def run(
        depth, f, f_stride, x, x_stride, out, out_stride, bias, overwrite, add_bias, residual,
        activation, has_residual,
    ):  # fmt: skip
        kernel(
            depth,
            f,
            3,
            1,
            f_stride,
            x,
            2,
            x_stride,
            out,
            1,
            out_stride,
            bias,
            1,
            overwrite,
            add_bias,
            residual,
            1,
            activation,
            has_residual,
        )

    dtype = np.dtype(dtype_name)
    for depth in (0, 1, lanes - 1, lanes, lanes + 1, 100):
        rng = np.random.default_rng(depth)
        f_stride, x_stride, out_stride = depth + 5, depth + 2, nwin + 3
        f = rng.standard_normal(3 + nf * f_stride).astype(dtype)
        x = rng.standard_normal(2 + nwin * x_stride).astype(dtype)
        out = rng.standard_normal(1 + nf * out_stride).astype(dtype)
        bias = rng.standard_normal(nf + 1).astype(dtype)
        rows = f[3:].reshape(nf, f_stride)[:, :depth].astype(np.float64)
        windows = x[2:].reshape(nwin, x_stride)[:, :depth].astype(np.float64)
        old = out[1:].reshape(nf, out_stride)
        tolerance = (
            (depth + 3)
            * np.finfo(dtype).eps
            * (np.abs(rows) @ np.abs(windows).T + np.abs(old[:, :nwin]) + np.abs(bias[1:, None]))
        )
        residual = rng.standard_normal(1 + nf * out_stride).astype(dtype)
        residual_tile = residual[1:].reshape(nf, out_stride)[:, :nwin].astype(np.float64)
        for overwrite, add_bias, activation, has_residual in (
            (True, False, None, False),
            (False, True, None, False),
            (False, True, "sigmoid", True),
            (True, False, "relu6", False),
        ):
            result = out.copy()
            run(
                depth, f, f_stride, x, x_stride, result, out_stride, bias, overwrite, add_bias,
                residual, activation_code(activation), has_residual,
            )  # fmt: skip
            tile = result[1:].reshape(nf, out_stride)
            expected = (
                rows @ windows.T
                + (bias[1:, None] if add_bias else 0)
                + (0 if overwrite else old[:, :nwin])
                + (residual_tile if has_residual else 0)
            )
            bound = tolerance + np.finfo(dtype).eps * np.abs(residual_tile)
            if activation is not None:
                bound = activation_bound(expected, bound, dtype)
                expected = activate(activation, expected)
            assert np.all(np.abs(tile[:, :nwin] - expected) <= bound)
            assert np.array_equal(tile[:, nwin:], old[:, nwin:]) and result[0] == out[0]
