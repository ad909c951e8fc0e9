"""The processes a command started, found in /proc and stopped with everything they started.

A command that is interrupted (or fails) midway cannot trust its own lists of children: the signal may
have come between a Popen and its registration, or inside a constructor that starts several. /proc
can: every live process whose parent is this one is this command's, and so is everything below it
(a worker's compile pool, a fork of it, an nvcc). The compile services the command's workers started
are not below it (a service detaches, to serve every process of its environment): they are found
by their runtime directory instead (stress.service_runtime).
"""

from __future__ import annotations

import contextlib
import os
import signal

from kcache.compile.protocol import readable_within

# A SIGKILLed process is gone within milliseconds; one that is not within this is stuck in the kernel
# (uninterruptible I/O), and waiting longer would not help.
EXIT_WAIT_S = 10.0


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now, zombies (already exited) left out."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # The command name, in parentheses, may hold spaces and parentheses: fields follow the last ')'.
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if fields and fields[0] != "Z":
            found[int(name)] = int(fields[1])
    return found


def descendants(pid: int | None = None) -> set[int]:
    """The live processes below `pid` (default: this one), at any depth."""
    top = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    pending = [top]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def stop_descendants() -> int:
    """SIGKILL every process below this one, and wait until each has exited; how many there were.

    They are stopped (SIGSTOP) first, round after round until no new one appears, so that none forks
    a process this misses between the look and the kill; then killed together. This process's own
    children are reaped; the others are reaped by their parents (or init), which kill them anyway."""
    stopped: set[int] = set()
    while True:
        fresh = descendants() - stopped
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in stopped:
        wait_gone(pid)
    return len(stopped)


def wait_gone(pid: int, timeout: float = EXIT_WAIT_S) -> bool:
    """Wait until process `pid` has exited (reaping it when it is this process's child); whether it did."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        exited = readable_within(pidfd, timeout)
    finally:
        os.close(pidfd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # a child of this process: reaped (a Popen of it then reads ECHILD)
    return exited
