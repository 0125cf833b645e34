"""The one error type users see: bad input (or an output the system cannot take), reported as one line with
exit status 2; and the checks of options that raise it."""

import errno
import json
import math
import numbers


class InputError(ValueError):
    """Malformed user input. The message names the file or option and the problem.

    Also an output the system cannot take (:func:`write_failed`: the disk is full, a quota is exceeded, the
    filesystem is read-only, no permission): one line naming the output, like bad input, never retried by the
    flows, and what was being written is removed first. One class (not a subclass), so everything that recognises
    bad input by its class name (the flows' filter of Prefect's log lines) recognises it too."""

    exit_status = 2


# what the system says when the device cannot take an output (whatever the output's content)
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def write_failed(exc: OSError, output, doing: str, outcome: str) -> InputError:
    """``exc``, raised while ``doing`` (e.g. "while writing it") into ``output``, as one line: ``output``, the
    system's reason, and ``outcome`` (what is left)."""
    return InputError(f"{output}: {exc.strerror or type(exc).__name__} {doing}; {outcome}")


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
