"""The checks every entry point shares, each in one place (pure Python).

Each raises ``TypeError`` or ``ValueError`` naming the parameter and what was
expected, before any work starts.
"""

from __future__ import annotations

import numpy as np


def as_array(value, name: str) -> np.ndarray:
    """``value`` as an ndarray of a real numeric dtype (not copied when it is one)."""
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.asarray(value)
        except Exception as error:  # ragged lists and the like
            raise TypeError(f"{name} must be array-like of real numbers: {error}") from None
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must have a real numeric dtype, got {array.dtype}")
    return array


def check_threads(threads, cores: int) -> int:
    """The worker count: ``threads``, or every one of ``cores`` when None.

    The one thread check and its one default: a plan is made for, and run
    on, at most the cores there are to run it (``Hardware.cores`` when
    planning; Numba's pool when running).
    """
    if threads is None:
        return int(cores)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int or None, got {type(threads).__name__}")
    if not 1 <= threads <= cores:
        raise ValueError(f"threads must be between 1 and {cores} (the cores), got {threads}")
    return int(threads)


def check_bias(bias, filters: int):
    """``bias`` as a ``(K,)`` array, or None."""
    if bias is None:
        return None
    bias = as_array(bias, "bias")
    if bias.shape != (filters,):
        raise ValueError(f"bias must have shape ({filters},) (K), got {bias.shape}")
    return bias


def check_residual(residual, shape):
    """``residual`` as an array of the output's ``shape``, or None."""
    if residual is None:
        return None
    residual = as_array(residual, "residual")
    if residual.shape != tuple(shape):
        raise ValueError(
            f"residual must have the output's shape {tuple(shape)} (N, K, P, Q), "
            f"got {residual.shape}"
        )
    return residual


def check_out(out, shape, dtype, inputs) -> None:
    """Raise unless ``out`` is None or a writeable C-contiguous array of
    ``shape`` and ``dtype`` that overlaps none of ``inputs``."""
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(
            f"out must have shape {shape} and dtype {dtype}, got {out.shape} and {out.dtype}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writeable")
    if any(a is not None and np.shares_memory(out, a) for a in inputs):
        raise ValueError("out must not overlap x, w or bias")


def check_ndim(array: np.ndarray, name: str, letters: str) -> None:
    """Raise unless ``array`` is 4-D (``letters`` names its axes)."""
    if array.ndim != 4:
        raise ValueError(f"{name} must be 4-D {letters}, got {array.ndim}-D shape {array.shape}")


def check_plannable_batch(batch: int, name: str) -> None:
    """Raise unless ``batch`` (the ``N`` a plan is made for) is at least 1.

    ``conv2d`` returns an empty batch's empty output without planning; a plan
    or packed filters are made for the images they will meet.
    """
    if batch < 1:
        raise ValueError(
            f"{name}[0] (N) must be >= 1 to plan: a plan is made for a batch of images "
            f"(conv2d itself accepts N = 0), got {batch}"
        )


def plain_parameters(parameters) -> bool:
    """Whether every one of ``parameters`` is a plain ``int``, ``str`` or
    ``None``, or a (nested) tuple of ints: parameters that may key a cache of
    checked calls (``True == 1`` or ``np.int64(1) == 1`` would make other
    types collide with ones the checks treat differently)."""
    for value in parameters:
        kind = type(value)
        # The common scalars inline: a call to _plain each cost a small call 0.1 us.
        if not (kind is int or value is None or kind is str or _plain(value)):
            return False
    return True


def _plain(value, depth=0) -> bool:
    kind = type(value)
    if kind is int or kind is str or value is None:
        return True
    return kind is tuple and depth < 2 and all(_plain(item, depth + 1) for item in value)
