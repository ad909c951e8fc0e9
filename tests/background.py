"""Slow differential drivers that run beside the rest of the suite (wired in tests/conftest.py).

The corpus and the fidelity table compile every kernel in fresh processes of plain TileLang and of
each kcache lane: about 17 CPU-minutes on CI's two cores, nearly all of it TileLang and nvcc. The
rest of the suite runs one test at a time and mostly waits on the processes it starts, so a core is
idle much of the time. A test module whose fixture waits on such drivers names a starter:

    BACKGROUND = {"corpus": start_corpus}   # fixture name -> starter(work directory) -> Started

When the session collects a test that uses the fixture, the starter runs as the session starts, at
a low CPU priority (`low_priority`), and the module's tests run last, when the fixture takes
what was started (`take`). The same processes do the same work, only sooner: nothing is compared
earlier, skipped or shared between lanes.

The priority: nice 19, and, where this user may make one (root, cgroup v1's cpu controller, as on
CI), a cpu cgroup of a small share (`CPU_SHARE`). nice alone is not enough with the kernel's
autogroups (`/proc/sys/kernel/sched_autogroup_enabled`): a compile service calls setsid(), and a new
session is a new autogroup that competes with the tests' as an equal, whatever its nice. A cgroup holds every
descendant, sessions included; whatever still runs in it at the end goes back to its parent group,
and the group is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller, where it is mounted
# Against the 1024 of each of the tests' groups: about a tenth of a core while the tests keep both
# cores busy, so that they barely notice it, and still enough that no driver starves past a time
# limit of its own (a fork of the caller has 30 s to start; a compile 600 s) and turns up as a
# lane's failure. The least share (2) leaves them next to nothing for as long as the tests are busy.
CPU_SHARE = 128
CGROUP_REMOVE_S = 10.0
_cgroup: list[Path | None] = []  # made once, on the first use


def low_priority() -> list[str]:
    """The prefix of a driver's command that runs it, and all it starts, at a low priority."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    if not _cgroup:
        _cgroup.append(_make_cgroup())
    group = _cgroup[0]
    if group is None:
        return nice
    # The shell joins the group, then becomes the driver: nothing starts before it has joined. A
    # failed join leaves the driver at nice 19 only (a priority, not a condition of the test).
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs 2>/dev/null; exec "$@"', "sh", *nice]


def _make_cgroup() -> Path | None:
    if not (CPU_CGROUPS / "cpu.shares").exists():
        return None
    group = CPU_CGROUPS / f"kcache-tests-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.shares").write_text(str(CPU_SHARE))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


def _remove_cgroup() -> None:
    """Move what still runs in the group to its parent, then remove it. A process that is exiting (a
    pool worker following its driver, by PR_SET_PDEATHSIG) cannot be moved and keeps the group busy
    for a moment: retried, backing off, for at most CGROUP_REMOVE_S; after that, one warning."""
    group = _cgroup.pop() if _cgroup else None
    if group is None:
        return
    deadline, delay = time.monotonic() + CGROUP_REMOVE_S, 0.01
    while True:
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (group.parent / "cgroup.procs").write_text(pid)
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                warnings.warn(f"could not remove the background drivers' cgroup {group}: {err}; rmdir it", stacklevel=1)
                return
        time.sleep(delay)  # no event says when an exiting task leaves the group
        delay = min(delay * 2, 0.5)


def lane_environments(prefix: str, work: Path, modes: Iterable[str]
                      ) -> tuple[dict[str, dict[str, str]], Path, list[Callable[[], None]]]:
    """Each mode's environment for a differential driver started before any test sets up its own:
    a TileLang cache of its own (nothing of the developer's); for `server`, a private runtime
    directory whose service compiles every kernel and does not idle out while the other tests hold
    the CPU (the cleanup stops it and waits until it is gone); for `fork`, a runtime directory whose path is too long for a
    socket, so no service is reached and every compile runs in a fork of the driver. Returns the
    environments, the server's runtime directory, and the cleanups for `Started`."""
    from stress.service_runtime import stop_services

    runtime = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: a socket's path has 107 bytes
    no_service = Path(tempfile.mkdtemp(prefix=prefix + "x" * 120, dir="/tmp"))
    lanes = {"server": {"XDG_RUNTIME_DIR": str(runtime), "KCACHE_SERVER_IDLE": "3600", "KCACHE_CALLER_FORK": "0"},
             "fork": {"XDG_RUNTIME_DIR": str(no_service), "KCACHE_CALLER_FORK": "1"}}
    private = {"TILELANG_CACHE_DIR": str(work / "tilelang-cache")}
    environments = {mode: {**private, **lanes.get(mode, {})} for mode in modes}
    return environments, runtime, [lambda: stop_services(runtime),
                                   lambda: shutil.rmtree(no_service, ignore_errors=True)]


@dataclass
class Started:
    """What a starter started: its drivers (name -> the process and its output file), what the test
    needs to know of them, and what stops whatever they left running (compile services)."""

    drivers: dict[str, tuple[subprocess.Popen[bytes], Path]]
    facts: dict[str, Any] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        """Kill the drivers still running (a failed or interrupted session) and run the cleanups."""
        for process, _out in self.drivers.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        for cleanup in self.cleanups:
            with contextlib.suppress(Exception):
                cleanup()


Starter = Callable[[Path], Started]
_wanted: dict[str, Starter] = {}
_started: dict[str, Started] = {}
_driver_pids: set[int] = set()  # every driver started at the session's start, running or not


def driver_pids() -> set[int]:
    """The background drivers' pids: children of this process that a test of its own children must
    leave alone (never wait on any child: that would reap a driver and lose its exit status)."""
    return set(_driver_pids)


def order(items: list[pytest.Item]) -> None:
    """Move the tests that use a background fixture to the end (in place, otherwise in their order)
    and note which starters this session needs."""
    late = []
    for item in items:
        starters: dict[str, Starter] = getattr(getattr(item, "module", None), "BACKGROUND", {})
        used = [name for name in starters if name in getattr(item, "fixturenames", ())]
        for name in used:
            _wanted[name] = starters[name]
        if used:
            late.append(item)
    items[:] = [item for item in items if item not in late] + late


def start_wanted(tmp_path_factory: pytest.TempPathFactory) -> None:
    for name, starter in _wanted.items():
        if name not in _started:
            _started[name] = starter(tmp_path_factory.mktemp(f"background-{name}"))
            _driver_pids.update(process.pid for process, _out in _started[name].drivers.values())


def take(name: str, starter: Starter, tmp_path_factory: pytest.TempPathFactory) -> Started:
    """The drivers started for `name` at the session's start, or started now (a session that did not
    collect through conftest's hook, or a second use)."""
    started = _started.pop(name, None)
    return started if started is not None else starter(tmp_path_factory.mktemp(name))


def stop_all() -> None:
    """At the session's end: stop whatever was started and not taken, and remove the cgroup."""
    for name in list(_started):
        _started.pop(name).stop()
    _remove_cgroup()
