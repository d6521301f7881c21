"""Errors meant for the user: the CLI prints them as one line and exits with code 2."""


class HarnessError(Exception):
    """Bad input or an unmet requirement, explained in one line (no traceback for the user)."""


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type when it has none."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(err).__name__


# Characters a terminal acts on rather than shows: C0 and C1 controls and DEL (ESC starts colour, cursor and title
# sequences; CR overwrites the line), line and paragraph separators, and the bidirectional overrides that reorder what
# is shown (Trojan Source).
_ACTIVE = {*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character a terminal would act on written as its escape (``\\x1b``, ``\\u202e``), but
    those in ``keep`` (``"\\n"``: lines stay lines): texts, names and paths from files are shown, never obeyed."""
    if not any(ord(c) in _ACTIVE for c in text):
        return text
    return "".join(
        c if c in keep or ord(c) not in _ACTIVE else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text
    )
