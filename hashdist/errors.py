"""The one error type users see: bad input, reported as one line with exit status 2."""


class InputError(ValueError):
    """Malformed user input. The message names the file or option and the problem."""

    exit_status = 2
