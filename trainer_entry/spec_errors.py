"""Errors of the training child."""


class SpecError(Exception):
    """Bad input in the spec or its data: reported as one line, without a traceback."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
