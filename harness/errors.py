"""Errors meant for the user: the CLI prints them as one line and exits with code 2."""


class HarnessError(Exception):
    """Bad input or an unmet requirement, explained in one line (no traceback for the user)."""
