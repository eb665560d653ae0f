"""Errors of the training child."""


class SpecError(Exception):
    """Bad input in the spec or its data: reported as one line, without a traceback.

    ``key``: the setting to blame, where one is (the check before launch places the
    line at the place that set it)."""

    def __init__(self, *args: object, key: str | None = None) -> None:
        super().__init__(*args)
        self.key = key


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
