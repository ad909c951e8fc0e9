"""`kcache server start|stop|status`: this user's compile service for this environment (sccache's
`--start-server`, `--stop-server`, `--show-stats`)."""

from __future__ import annotations

import argparse
from typing import Any

from kcache.config import Settings


def cmd_server(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.compile.jobs import usable_cpu_count
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service import connection as service_connection
    from kcache.compile.service.address import identity, socket_path

    workers = settings.compile_workers or usable_cpu_count()
    name = identity(TILELANG_PRELOAD, workers)
    where = str(socket_path(name))
    if args.action == "start":
        try:
            conn, pid, _warm = service_connection.connect_or_start(name, workers, TILELANG_PRELOAD, settings.server_idle_s)
        except service_connection.ServiceUnavailable as err:
            return {"running": False, "socket": where, "error": str(err)}, f"not started: {err}", 1
        conn.close()
        return {"running": True, "pid": pid, "socket": where}, f"compile service running: pid {pid}, {where}", 0
    try:
        reply = service_connection.request(name, ("status",) if args.action == "status" else ("stop",))
    except (OSError, EOFError):
        return {"running": False, "socket": where}, f"no compile service running ({where})", \
            0 if args.action == "stop" else 1
    if args.action == "stop":
        return {"running": False, "stopped_pid": reply, "socket": where}, f"stopped the compile service (pid {reply})", 0
    status = {"running": True, "socket": where, **reply}
    text = "\n".join(f"{key:<16} {value}" for key, value in status.items())
    return status, text, 0
