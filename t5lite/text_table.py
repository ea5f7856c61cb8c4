"""The one plain-text table printer (`t5lite models`, `tasks list`, command summaries)."""

from __future__ import annotations

from typing import Sequence


def format_table(rows: Sequence[Sequence[str]], header: bool = True) -> str:
    """Columns left-aligned, two spaces apart, trailing spaces stripped; with ``header`` the
    first row is underlined with dashes."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
