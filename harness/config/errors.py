"""Errors meant for the user: the CLI prints them as one line and exits with code 2."""


class HarnessError(Exception):
    """Bad input or an unmet requirement, explained in one line (no traceback for the user)."""


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type when it has none."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(err).__name__
