"""One way to write a Markdown table, for every file the report and compare write."""

from __future__ import annotations

from collections.abc import Sequence


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a table; a ``|`` inside a cell is escaped so it cannot split it."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out
