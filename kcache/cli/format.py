"""How `kcache` prints: keys, sizes, ages, times, tables."""

from __future__ import annotations

import time

# Every command shows this many hex digits of a key (a unique prefix is accepted wherever a key is).
KEY_WIDTH = 16


def short_key(key: str) -> str:
    return key[:KEY_WIDTH]


def human_time(epoch_s: float) -> str:
    """A moment as local clock time, with its zone: "2026-11-25 06:48:23 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch_s))


def human_size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def count_of(n: int, one: str, many: str) -> str:
    """ "1 entry", "3 entries": the noun agrees with the number."""
    return f"{n} {one if n == 1 else many}"


def human_age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def format_table(columns: list[str], rows: list[tuple], show_header: bool = True) -> str:
    cells = [columns, *[[str(c) for c in row] for row in rows]] if show_header else [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)

