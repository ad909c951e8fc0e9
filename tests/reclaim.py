"""What a test session leaves on the machine when it is killed outright (SIGKILL, an OOM kill, a host
that lost its runner), reclaimed at the next session's start (issue 68).

A session marks what it makes in a shared place with its holder name (`pid.starttime`: a reused pid
is told apart): its unprivileged venv (/tmp/kcache-unprivileged-*), its runtime directory of compile
services (/tmp/ks-*), its pytest temporary directory (where tests mount tmpfs). The next session
removes what a dead holder marked: it unmounts, stops the services, removes the directories, and the
test users and group once no live session holds them (tests/unprivileged.py). What carries no mark
(another checkout's session, an older suite's) is left alone: it may be running. A session that is
stopped by SIGTERM or SIGINT cleans up itself (tests/conftest.py), as at a normal end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from .leftovers import mounts_under
from .unprivileged import holder_name, reclaim_users

MARK = ".kcache-test-session"
TMP = Path("/tmp")
MARKED = ("kcache-unprivileged-*", "ks-*")  # the directories a session makes under /tmp and marks


def mark(directory: Path) -> None:
    """Note that this session made `directory`: the next session reclaims it if this one dies first."""
    holder = holder_name(os.getpid())
    assert holder is not None
    (directory / MARK).write_text(holder + "\n")


def dead_holder(directory: Path) -> bool:
    """Whether `directory` is marked by a session that no longer runs (unmarked: not known to be dead)."""
    try:
        holder = (directory / MARK).read_text().strip()
    except OSError:
        return False
    return bool(holder) and holder_name(int(holder.split(".")[0])) != holder


def reclaim() -> list[str]:
    """Remove what dead sessions left; what was removed, for the session's log."""
    removed = []
    for base in sorted(TMP.glob("pytest-of-*/pytest-*")):
        if base.is_dir() and dead_holder(base):
            for point in sorted(mounts_under(base), key=len, reverse=True):  # the deepest first
                if subprocess.run(["umount", "-l", point], capture_output=True, check=False).returncode == 0:
                    removed.append(f"mount {point}")
    for pattern in MARKED:
        for directory in sorted(TMP.glob(pattern)):
            if not dead_holder(directory):
                continue
            if directory.name.startswith("ks-"):
                from stress.service_runtime import stop_services

                with contextlib.suppress(Exception):  # a service that is gone already
                    stop_services(directory, wait=False)
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(str(directory))
    removed += [f"user or group {name}" for name in reclaim_users()]
    return removed
