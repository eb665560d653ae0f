"""Errors of the training child."""


class SpecError(Exception):
    """Bad input in the spec or its data: reported as one line, without a traceback."""
