"""Per-cache counters (this process). Persisted, cross-process stats are the CLI's job."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0  # found nothing usable in memory or on disk at first look
    compiles: int = 0
    lost_races: int = 0
    corrupt_entries: int = 0
    publish_failures: int = 0
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
