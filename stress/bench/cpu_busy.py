"""The machine's CPU time as /proc/stat counts it, sampled in a thread: how many cores a window kept busy.

Used by the bench's rows that ask whether a lane is short of CPU or short of scheduling (issue 67's
tunes at once): the busy core-seconds between two instants, from the whole machine's counters (a bench
runs alone on its machine), interpolated between samples 20 ms apart.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from types import TracebackType

STAT = "/proc/stat"
EVERY_S = 0.02


def busy_and_total() -> tuple[int, int]:
    """The machine's busy and total clock ticks so far: `cpu` line of /proc/stat, user to steal (guest
    time is in user already); idle and iowait are not busy."""
    with open(STAT) as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


class CpuSampler:
    """`with CpuSampler() as cpu: ...`, then `cpu.core_seconds(start, end)` (epoch seconds). None where
    the machine has no /proc/stat."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.busy: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-cpu-sampler", daemon=True)
        self.available = os.path.exists(STAT)

    def __enter__(self) -> CpuSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(timeout=5)

    def _sample(self) -> None:
        stopping = False
        while not stopping:
            stopping = self._stop.wait(EVERY_S) if self.times else False
            self.times.append(time.time())  # the last one after the stop: the window's end is within
            self.busy.append(busy_and_total()[0])

    def core_seconds(self, start: float, end: float) -> float | None:
        """The CPU seconds the machine spent between `start` and `end`, or None outside the samples."""
        if len(self.times) < 2 or start < self.times[0] or end > self.times[-1]:
            return None
        ticks = self._ticks_at(end) - self._ticks_at(start)
        return ticks / os.sysconf("SC_CLK_TCK")

    def full_between(self, start: float, end: float, cores: int, share: float = 0.9) -> tuple[float, float] | None:
        """(seconds from `start` until a sample interval first kept `share` of `cores` busy, seconds from
        the last such interval's end to `end`): a window's ramp and tail. None outside the samples, or
        where no interval within the window was that busy."""
        if len(self.times) < 2 or start < self.times[0] or end > self.times[-1]:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        full = [(t0, t1) for t0, t1, b0, b1 in zip(self.times, self.times[1:], self.busy, self.busy[1:])
                if t1 > start and t0 < end and t1 > t0 and (b1 - b0) / tick / (t1 - t0) >= share * cores]
        if not full:
            return None
        return max(0.0, full[0][0] - start), max(0.0, end - full[-1][1])

    def _ticks_at(self, instant: float) -> float:
        after = min(max(bisect.bisect_left(self.times, instant), 1), len(self.times) - 1)
        t0, t1 = self.times[after - 1], self.times[after]
        b0, b1 = self.busy[after - 1], self.busy[after]
        return b0 + (b1 - b0) * ((instant - t0) / (t1 - t0) if t1 > t0 else 0.0)
