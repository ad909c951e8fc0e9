"""`kcache server start|stop|status`: this user's compile service for this environment (sccache's
`--start-server`, `--stop-server`, `--show-stats`)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from kcache.cli.contract import NotStarted
from kcache.config import Settings
from kcache.errors import TileLangMissing


def cmd_server(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.compile.jobs import usable_cpu_count
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service import connection as service_connection
    from kcache.compile.service.address import identity, socket_path

    if args.action == "start" and importlib.util.find_spec("tilelang") is None:
        # Its workers preload TileLang: without it the service would answer "running" and never get a worker.
        raise TileLangMissing("the compile service compiles TileLang's kernels")
    workers = settings.compile_workers or usable_cpu_count()
    name = identity(TILELANG_PRELOAD, workers)
    where = str(socket_path(name))
    if args.action == "start":
        try:
            conn, pid, _warm = service_connection.connect_or_start(name, workers, TILELANG_PRELOAD, settings.server_idle_s)
        except service_connection.ServiceUnavailable as err:
            raise NotStarted(f"server start: the compile service did not start: {err}", where) from err
        conn.close()
        return {"running": True, "pid": pid, "socket": where}, f"compile service running: pid {pid}, {where}", 0
    try:
        reply = service_connection.request(name, ("status",) if args.action == "status" else ("stop",))
    except (OSError, EOFError):
        return {"running": False, "socket": where}, f"no compile service running ({where})", \
            0 if args.action == "stop" else 1
    if args.action == "stop":
        return {"running": False, "stopped_pid": reply, "socket": where}, f"stopped the compile service (pid {reply})", 0
    # The service's own "running" counts its running jobs: renamed, so that "running" means the service.
    status = {**{("jobs_running" if key == "running" else key): value for key, value in reply.items()},
              "running": True, "socket": where}
    return status, summary(status), 0


def summary(status: dict[str, Any]) -> str:
    """What `doctor` says of the service, a line a topic: process, workers, jobs, when it exits."""
    from kcache.cli.format import count_of, human_age, human_size

    warm = "warm" if status.get("warm") else "starting its first worker"
    template = f"forked from template pid {status['template_pid']}" if status.get("template_pid") else "started by exec"
    budget = status.get("memory_budget_bytes")
    memory = human_size(status["worker_memory_bytes"]) + (f" of a {human_size(budget)} budget" if budget else "")
    return "\n".join((
        f"compile service running: pid {status['pid']}, up {human_age(status['uptime_s'])}, {warm}",
        f"  socket   {status['socket']}",
        f"  workers  {status['workers']} of {status['max_workers']}, {template}; {memory}",
        f"  jobs     {status['jobs']} served ({status['failed']} failed), {status['jobs_running']} running, "
        f"{status['queued']} queued; {count_of(status['clients'], 'client', 'clients')} connected",
        f"  exits    after {human_age(status['idle_timeout_s'])} idle (KCACHE_SERVER_IDLE); `kcache server stop` now",
    ))
