"""Per-shape tables: how calibrations name a micro-kernel shape, and how a
table of ``(shape, number)`` pairs is validated (the weights' and the
measured rates' tables alike)."""

from __future__ import annotations


def kernel_shape_key(filters_per_tile: int, windows_per_tile: int, vector_operand) -> str:
    """``"<Nf>x<Nwin><w|f|r>"``: a micro-kernel shape and the operand in its
    vectors (windows, filters, reduction), as calibrations name it."""
    operand = getattr(vector_operand, "value", vector_operand)
    return f"{int(filters_per_tile)}x{int(windows_per_tile)}{str(operand)[:1]}"


def shape_pairs(value, what: str, zero_allowed: bool = True) -> tuple:
    """A per-shape table validated: sorted ``(shape, number)`` pairs, from
    pairs or a mapping (as a JSON file holds them); ``what`` names it in
    errors.

    Raises
    ------
    TypeError, ValueError
        When an entry is not a (str, number) pair, or its number is not
        finite and non-negative (positive unless ``zero_allowed``).
    """
    pairs = value.items() if isinstance(value, dict) else value
    try:
        if isinstance(pairs, (str, bytes)):
            raise TypeError
        pairs = [tuple(pair) for pair in pairs]
    except TypeError:
        raise TypeError(f"{what} must be (shape, number) pairs, got {value!r}") from None
    checked = {}
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise TypeError(f"{what}: {pair!r} is not a (shape, number) pair")
        name, number = pair
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise TypeError(f"{what}[{name!r}] must be a number, got {number!r}")
        if not (0.0 <= number < float("inf")) or (number == 0 and not zero_allowed):
            kind = "non-negative" if zero_allowed else "positive"
            raise ValueError(f"{what}[{name!r}] must be finite and {kind}, got {number!r}")
        checked[name] = float(number)
    return tuple(sorted(checked.items()))
