"""The one error type users see: bad input, reported as one line with exit status 2; and the checks of
options that raise it."""

import json
import math
import numbers


class InputError(ValueError):
    """Malformed user input. The message names the file or option and the problem."""

    exit_status = 2


def is_integer(value) -> bool:
    """A Python or NumPy integer, not a bool (an integral float such as 2.0 is not one)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_integer(value, option: str, lo: int = 1, hi: int | None = None) -> int:
    """``value`` as an int when :func:`is_integer` and in lo..hi; else InputError naming ``option``."""
    if not is_integer(value) or value < lo or (hi is not None and value > hi):
        if hi is not None:
            wanted = f"an integer in {lo}..{hi}"
        else:
            wanted = {0: "a non-negative integer", 1: "a positive integer"}.get(lo, f"an integer >= {lo}")
        shown = repr(value) if isinstance(value, str) else value
        raise InputError(f"{option} must be {wanted}, got {shown}")
    return int(value)


def check_number(value, option: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """``value`` as a float: a finite real number (not a bool) in [lo, hi]; else InputError naming ``option``."""
    finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not finite or not lo <= value <= hi:
        if not finite:
            wanted = "a finite number"
        else:
            wanted = f"in [{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
        shown = repr(value) if isinstance(value, str) else value
        raise InputError(f"{option} must be {wanted}, got {shown}")
    return float(value)


def json_object(text: str, option: str) -> dict:
    """``text`` parsed as a JSON object (keyword arguments); else InputError naming ``option``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"{option} must be a JSON object")
    return value
