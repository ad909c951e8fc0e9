"""A private runtime directory for one run's compile services (XDG_RUNTIME_DIR): its services are the
run's own, can be found (to kill them, in the chaos mix) and are stopped at its end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kcache.compile.workers.worker import TEMPLATE_NAME, WORKER_NAME

from .own_processes import wait_gone
from .procs import environ

SERVICE_MARK = b"kcache.compile.service.server_process"
STOP_WAIT_S = 10.0


# The longest temporary directory a runtime directory goes in: its socket's path, <runtime>/kcache/
# compile-<20 hex>.sock, must fit a Unix socket's 107 bytes.
MAX_BASE_BYTES = 50


def fresh_runtime(prefix: str = "ks-") -> Path:
    """A new private runtime directory: in the temporary directory (TMPDIR) where its sockets' paths
    fit, else in /tmp."""
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) > MAX_BASE_BYTES:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


@contextlib.contextmanager
def own_services(prefix: str = "ks-") -> Iterator[Path]:
    """A fresh runtime directory for the block's compile services, which are stopped at its end."""
    runtime = fresh_runtime(prefix)
    try:
        yield runtime
    finally:
        stop_services(runtime)


def warm_service() -> None:
    """The compile service of this process's environment started, with one worker forked and warm
    (TileLang imported): as after any kcache process of this user ran here within the idle time."""
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service.client import ServicePool

    service = ServicePool(None, None, TILELANG_PRELOAD, 600.0, lambda: None)
    service.run(abs, -1)
    service.close()


def service_name() -> str:
    """The name of the compile service that TileLang's processes of this process's environment use (its
    settings are theirs: the runtime directory, the workers)."""
    from kcache.compile.jobs import usable_cpu_count
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service.address import identity

    return identity(TILELANG_PRELOAD, int(os.environ.get("KCACHE_COMPILE_WORKERS") or usable_cpu_count()))


def stop_service(name: str, within_s: float = 60.0) -> None:
    """Ask the service `name` of this process's environment to stop, and wait until it has exited: the
    next process finds none running. Nothing where none runs."""
    from kcache.compile.service import connection as service_connection

    with contextlib.suppress(OSError, EOFError):
        wait_gone(service_connection.request(name, ("stop",)), within_s)


def service_pids(runtime: Path) -> list[int]:
    """The compile servers started with this runtime directory (read from their environment), not
    their worker template and workers, which are forks of a server."""
    return service_processes(runtime, forks=False)


def service_processes(runtime: Path, *, forks: bool = True) -> list[int]:
    """The compile servers started with this runtime directory, and with `forks` their worker
    templates and workers (forks of a server: its command line and environment)."""
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
                if not forks and f.read().strip() in (TEMPLATE_NAME, WORKER_NAME):
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

    with environ({"XDG_RUNTIME_DIR": str(runtime)}):
        for name in service_names(runtime):
            with contextlib.suppress(OSError, EOFError):
                service_connection.request(name, ("stop",))
    # Gone before the next scenario measures (a service that lingers would count as its workers), and
    # before the command that started them ends: its workers and template too, which die with it
    # (PR_SET_PDEATHSIG), a moment after it.
    if wait:
        for pid in [*service_pids(runtime), *service_processes(runtime)]:  # the servers first
            if not wait_gone(pid, STOP_WAIT_S):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_gone(pid, STOP_WAIT_S)
    shutil.rmtree(runtime, ignore_errors=True)


def service_names(runtime: Path) -> list[str]:
    """The names of the services whose sockets are in this runtime directory."""
    sockets = (runtime / "kcache").glob("*.sock")
    return [socket.name.removeprefix("compile-").removesuffix(".sock") for socket in sockets]
