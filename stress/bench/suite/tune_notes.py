"""The note of a tune in its benchmark phase, read from its lock file: how the benches find the process
to kill mid-tune (stress.bench.tune_once, stress.bench.multigpu)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def benchmarking_tuner(root: Path) -> dict[str, Any] | None:
    """The note of a tune under `root` (`<root>/.locks/tune-*.lock`) that is benchmarking and has
    timed at least one config: {"pid", "done", "total", ...}; None where there is none yet."""
    from kcache.store.locks import read_note

    for lock in (root / ".locks").glob("tune-*.lock"):
        try:
            note = json.loads(read_note(lock) or b"{}")
        except ValueError:
            continue
        if note.get("phase") == "benchmarking" and note.get("done", 0) >= 1:
            return note
    return None
