"""What a command left behind: every process that carries a test's mark in its environment (whatever the
command started inherits it: workers, compile services and their forks, stagers), and the files in a
temporary directory of the test's own (TMPDIR).

    def test_x(scratch):  # the fixture (tests/conftest.py)
        child = subprocess.Popen([...], env=child_env(**scratch.env))
        ...
        assert processes_of(scratch) == [] and os.listdir(scratch.path) == []
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import TypeVar

MARK = "KCACHE_TEST_LEFTOVER_MARK"
T = TypeVar("T")


@dataclass
class Scratch:
    path: Path  # short (/tmp/kt-...): a runtime directory made in it keeps its sockets' paths under 107 bytes
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def env(self) -> dict[str, str]:
        """For the command: its temporary directory, and the mark its processes inherit."""
        return {"TMPDIR": str(self.path), MARK: self.mark}


def processes_of(scratch: Scratch) -> list[str]:
    """The live processes (zombies, which have exited, left out) whose environment holds the mark:
    'pid name: command line' each."""
    wanted = f"{MARK}={scratch.mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            with open(f"/proc/{name}/comm") as f:
                found.append(f"{name} {f.read().strip()}: {command}")
        except OSError:
            continue  # gone meanwhile
    return found


def mounts_under(directory: Path) -> list[str]:
    """The mount points at or under `directory` (/proc/self/mountinfo; its octal escapes decoded)."""
    prefix = str(directory).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    return [point for point in points if point == prefix[:-1] or point.startswith(prefix)]


def wait_for(condition: Callable[[], T], child: Popen, what: str, timeout: float = 120.0) -> T:
    """Until `condition()` is truthy (a file appeared); fails at once if `child` exited first. Polls:
    a file has no line to block on."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if child.poll() is not None:
            raise AssertionError(f"the command exited ({child.returncode}) before {what}: "
                                 f"{child.stdout.read() if child.stdout else ''}{child.stderr.read() if child.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        time.sleep(0.05)
