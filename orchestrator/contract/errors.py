"""Errors a user can fix. The CLI prints them as one line and exits with 2."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class UserError(Exception):
    """Bad input: a file, a flag or a value the user can correct."""


class ConfigError(UserError):
    """A problem at a place in a config file: ``file:line: key.path: message``."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = self.file if self.line is None else f"{self.file}:{self.line}"
            where += ": "
        if self.key:
            where += f"{self.key}: "
        return f"{where}{self.message}"


@dataclass(frozen=True)
class Place:
    """Where a setting was written: a file, its line, and the key path in it."""

    file: str | None = None
    line: int | None = None
    key: str | None = None

    def error(self, message: str) -> ConfigError:
        """``message`` as a ``ConfigError`` at this place."""
        return ConfigError(message, file=self.file, line=self.line, key=self.key)
