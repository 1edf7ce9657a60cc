"""Plain-text tables for the command-line tools."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """Render ``rows`` with ``columns`` as (key, header) pairs, left-aligned."""
    body = [[cell(row.get(key)) for key, _ in columns] for row in rows]
    headers = [header for _, header in columns]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """Render ``label: value`` lines with aligned values."""
    items = [(label, cell(value)) for label, value in pairs]
    width = max((len(label) for label, _ in items), default=0)
    return "\n".join(f"{label + ':':<{width + 1}} {value}" for label, value in items)
