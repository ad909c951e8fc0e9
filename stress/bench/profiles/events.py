"""The events of a profiled process: each step's start and end on the machine's wall clock (which all
processes share), appended to the log that KCACHE_PHASES_LOG names, by wrapping the step's function in
the process (a fork of it inherits the wrappers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_ENV = "KCACHE_PHASES_LOG"

# This process's events, kept in memory between hold_events() and flush_events(); None: written at once.
_held: list[tuple[str, float, float]] | None = None


def log_event(what: str, start: float, end: float) -> None:
    if _held is not None:
        _held.append((what, start, end))
        return
    _append(_line(what, start, end))


def _line(what: str, start: float, end: float) -> str:
    return json.dumps({"pid": os.getpid(), "what": what, "start": start, "end": end}) + "\n"


def hold_events() -> None:
    """Keep this process's events in memory until flush_events(): a step's logging (its JSON, a file
    opened, written and closed: about 20 us on the CPU machine) then adds about 1 us to the timed steps
    around it. For a process that does not fork (a fork would take a copy of the held events)."""
    global _held
    _held = []


def flush_events() -> None:
    global _held
    held, _held = _held, None
    if held:
        _append("".join(_line(*event) for event in held))


def _append(text: str) -> None:
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def timed(original: Callable[..., Any], record: Callable[[float, float], None],
          clock: Callable[[], float] = time.time) -> Callable[..., Any]:
    """`original` wrapped: each call's start and end on `clock` handed to `record`, however the call ends."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return original(*args, **kwargs)
        finally:
            record(start, clock())

    return wrapper


def timed_steps(steps: list[tuple[Any, str, str]]) -> None:
    """Wrap each (owner, attribute, what) so that its calls log `what` with their start and end."""
    for owner, attribute, what in steps:
        setattr(owner, attribute, timed(getattr(owner, attribute),
                                        lambda start, end, what=what: log_event(what, start, end)))


def events_of(profile: str, child: list[str], env: dict[str, str], timeout: float) -> list[dict[str, Any]]:
    """The events that one fresh process, `python -m stress.bench.profiles.PROFILE --child CHILD...` in
    this environment with `env`, logged into env[LOG_ENV] (emptied first)."""
    log = Path(env[LOG_ENV])
    log.write_text("")
    done = subprocess.run([sys.executable, "-m", f"stress.bench.profiles.{profile}", "--child", *child],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"sample {'/'.join(child[:-1])} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
