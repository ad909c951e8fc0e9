"""The note of a tune in its benchmark phase, read from its lock file: how the benches find the process
to kill mid-tune (stress.bench.standalone.tune_once, stress.bench.standalone.multigpu)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
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


def kill_the_tuner(root: Path, running: Callable[[], bool], within_s: float, since: float) -> dict[str, Any]:
    """SIGKILL the process whose note under `root` says it is benchmarking, once it has timed a config:
    {"pid", "benchmarked_before_kill", "of", "after_s"} (seconds from `since`, a time.monotonic(), to
    the kill). Polled while `running()`, for at most `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and running():
        note = benchmarking_tuner(root)
        if note is not None:
            os.kill(int(note["pid"]), signal.SIGKILL)
            return {"pid": int(note["pid"]), "benchmarked_before_kill": note["done"], "of": note["total"],
                    "after_s": time.monotonic() - since}
        time.sleep(0.05)  # the bench's monitor polls the note; the tuners do not wait on it
    raise RuntimeError(f"no process reached the tune's benchmark phase within {within_s:g} s")


def killed_note(reading: dict[str, Any]) -> str:
    """The end of a report's line for a run whose tuner was killed: which, and how far it had got."""
    killed = reading.get("killed")
    if not killed:
        return ""
    return f"  killed pid {killed['pid']} after {killed['benchmarked_before_kill']}/{killed['of']} configs"
