"""The compile service's process: it detaches, takes its name, listens, serves, and cleans up after itself.

    run(["--name", NAME, "--workers", N, "--idle", SECONDS, "--preload", JSON, "--ready-fd", FD])

Started on demand by a client (`connection.start`), detached (it forks once and its parent exits,
so it is nobody's child), it keeps a `CompilePool` of warm workers forked from a worker template,
and serves this user's processes with it (`server.Server`).

- Only one server per name: it holds `compile-NAME.lock` (flock) for its life. A stale socket file
  left by a dead server is removed under that lock, never one in use.
- With no job for `--idle` seconds the server exits; the next miss starts a new one. What it leaves
  in its private directory goes with it, but its log.

Apart from `server` because this is the process around the serving (its start, in an order that
matters, and its end), while `server` is what it does for its clients meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING

from kcache.compile.service.server import Server

if TYPE_CHECKING:
    from kcache.compile.compile_slots import CompileSlots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcache.compile.service.server_process")
    parser.add_argument("--name", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--idle", type=float, required=True)
    parser.add_argument("--preload", default="[]")
    parser.add_argument("--ready-fd", type=int, default=-1)
    parser.add_argument("--sys-path", default=None, help="the client's sys.path (JSON): jobs import as there")
    args = parser.parse_args(argv)
    if args.sys_path:
        from kcache.compile.workers.worker import importable_path

        sys.path[:] = importable_path(json.loads(args.sys_path))
    if os.fork() > 0:  # detach: the starter reaps this parent at once, the server is nobody's child
        os._exit(0)
    ready = args.ready_fd

    def tell(word: bytes) -> None:
        nonlocal ready
        if ready >= 0:
            with contextlib.suppress(OSError):
                os.write(ready, word)
            os.close(ready)
            ready = -1

    from kcache.compile.service import address
    from kcache.store.locks import take_file_lock

    lock_fd = take_file_lock(address.lock_path(args.name))  # held for the service's life
    if lock_fd is None:
        tell(b"busy")  # another server of this name runs or is starting
        return 0
    from kcache.compile.workers.worker import SERVER_NAME, name_process

    name_process(SERVER_NAME)
    from kcache.compile.pool.process_pool import CompilePool

    pool = CompilePool(args.workers, None, preload=json.loads(args.preload), start="fork")
    # The template is forked from this process now, while it holds one thread and no listener: its
    # TileLang import, which the first compile waits for, starts without an interpreter's start and
    # kcache's imports before it (on a loaded machine, a herd's ranks importing TileLang beside it,
    # those were a good part of its lag). It closes this process's descriptors (the lock, the pipe
    # to the starter).
    pool.start_template(forked=True)
    path = address.socket_path(args.name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # stale: its server is dead, or it would hold the lock
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o077)
    try:
        listener.bind(str(path))
    finally:
        os.umask(previous)
    listener.listen(128)
    identity = os.stat(path)

    from kcache.compile.compile_slots import CompileSlots
    from kcache.setting_values import compile_memory_budget

    slots = CompileSlots(args.name, args.workers)
    server = Server(listener, pool, args.idle, compile_memory_budget(), slots)
    threading.Thread(target=server.warm_up, daemon=True).start()  # overlaps the first client's imports
    tell(b"ready")
    try:
        server.serve()
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path)[:2] == identity[:2]:
                os.unlink(path)
        listener.close()
        pool.close()
        _remove_runtime_files(args.name, slots, lock_fd)
    return 0


def _remove_runtime_files(name: str, slots: CompileSlots, lock_fd: int) -> None:
    """What the service leaves in its private directory goes with it: the slot files and the start
    lock nobody holds (a client compiling in a fork of itself keeps its slot's), then its own lock,
    while it still holds it. Each is removed by a holder of its flock, and a taker checks that the
    path still names the file it locked (kcache.store.locks.take_file_lock). The log stays: the record
    of what the service did and why it exited, appended to by the next service of this name."""
    from kcache.compile.service import address
    from kcache.store.locks import remove_free_lock_file, unlink_held

    with contextlib.suppress(OSError):
        for index in range(slots.count):
            remove_free_lock_file(slots.path(index))
        remove_free_lock_file(address.start_lock_path(name))
        unlink_held(lock_fd, address.lock_path(name))


def run(argv: list[str]) -> int:
    """The service's process (`connection.start` runs it through `interpreter.python_command`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return main(argv)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
