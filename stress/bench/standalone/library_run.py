"""What `python -m stress.bench --only triton-library` runs (the library's tests) and what one run of
them found: the scenario's rows (library_rows) are read from these."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Run:
    name: str  # numbered, as its log: "03-kcache-cold-turn1"
    lane: str
    turn: int
    wall_s: float
    verdicts: dict[str, str]  # test -> its outcome(s)
    stats: dict[str, Any]  # a kcache run's root's `kcache stats --json` after it (cumulative); {} for Triton's
    compile_spans: dict[str, Any] | None = None  # its compiles, by tune (stress.bench.jobs.compile_spans)


@dataclass
class Library:
    """What is run: the folder of the library's tests, the module in it, pytest's -k, and the library."""
    folder: Path
    tests: str
    keyword: str | None
    dist: str
    version: str

    @property
    def label(self) -> str:
        selected = f" -k {self.keyword!r}" if self.keyword else ""
        return f"triton-library ({self.dist} {self.version}: {self.tests}{selected})"
