"""A private runtime directory for one run's compile services (XDG_RUNTIME_DIR): its services are the
run's own, can be found (to kill them, in the chaos mix) and are stopped at its end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from kcache.compile.protocol import readable_within
from kcache.compile.workers.worker import TEMPLATE_NAME, WORKER_NAME

SERVICE_MARK = b"kcache.compile.service.server"
STOP_WAIT_S = 10.0


def fresh_runtime(prefix: str = "ks-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: a socket's path has 107 bytes


def service_pids(runtime: Path) -> list[int]:
    """The compile servers started with this runtime directory (read from their environment), not
    their worker template and workers, which are forks of a server."""
    wanted = b"XDG_RUNTIME_DIR=" + os.fsencode(runtime)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if SERVICE_MARK not in f.read():
                    continue
            with open(f"/proc/{name}/comm") as f:
                if f.read().strip() in (TEMPLATE_NAME, WORKER_NAME):  # the server's forks: its command line
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def stop_services(runtime: Path, *, wait: bool = True) -> None:
    """Stop every service of this runtime directory and remove it. `wait`: until each has exited (a
    benchmark's next scenario must not count its workers), killing one that takes over STOP_WAIT_S;
    the test suite only asks them to stop."""
    from kcache.compile.service import connection as service_connection

    previous = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        for socket_file in (runtime / "kcache").glob("*.sock"):
            with contextlib.suppress(OSError, EOFError):
                service_connection.request(socket_file.name.removeprefix("compile-").removesuffix(".sock"), ("stop",))
    finally:
        if previous is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = previous
    # Gone before the next scenario measures: a service that lingers would count as its workers.
    for pid in service_pids(runtime) if wait else ():
        with contextlib.suppress(ProcessLookupError):
            pidfd = os.pidfd_open(pid)
            try:
                if not readable_within(pidfd, STOP_WAIT_S):
                    os.kill(pid, signal.SIGKILL)  # its workers die with it (PR_SET_PDEATHSIG)
            finally:
                os.close(pidfd)
    shutil.rmtree(runtime, ignore_errors=True)
