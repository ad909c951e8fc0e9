"""Triton's lookups counted into `kcache stats` (triton_hits, _misses, _compiles) and logged
(KCACHE_LOG): what kcache.triton.manager's get_group and put_group report."""

from __future__ import annotations

import logging
from pathlib import Path

from kcache.maintenance.counter_file import count_lookup
from kcache.triton.store import kernel_name

log = logging.getLogger("kcache")


class Lookup:
    """One `get_group`: a hit where it found the group without compiling it (a wait for another
    process's compile included), else a miss; a compile in a worker makes it a miss and a compile."""

    __slots__ = ("found", "how", "compiled_isolated")

    def __init__(self) -> None:
        self.found: dict[str, str] | None = None
        self.how = "disk"
        self.compiled_isolated = False

    def count(self, root: Path | None, filename: str, key: str) -> None:
        if self.found is not None and not self.compiled_isolated:
            counted(root, "hit", filename, key, f" ({self.how})")
            return
        counted(root, "miss", filename, key, ": compiling" if self.found is None else ": compiled in a worker")
        if self.compiled_isolated:
            counted(root, "compile", filename, key, " (in a worker)")


def counted(root: Path | None, event: str, filename: str, key: str, detail: str = "") -> None:
    """Count `event` (hit, miss, compile) into `root`'s stats as Triton's, and log it (KCACHE_LOG); a
    wait is logged only."""
    if event != "wait":
        count_lookup(root, "triton", **{_COUNTER[event]: 1})
    # kcache.lookup_log's levels (a hit at debug, the rest at info), asked here: a fresh process's hit that
    # logs nothing does not load it.
    if log.isEnabledFor(logging.DEBUG if event == "hit" else logging.INFO):
        from kcache import lookup_log

        lookup_log.lookup("triton", event, kernel_name(filename), key, detail)


_COUNTER = {"hit": "hits", "miss": "misses", "compile": "compiles"}
