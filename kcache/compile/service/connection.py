"""Reaching this user's compile service: connect to it, start it when none listens (one starter
among the processes that find none), and ask it for its status or to stop."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

from kcache.compile import protocol as wire
from kcache.compile.interpreter import POPEN, internal_environment, python_command
from kcache.compile.runtime_dir import NoServiceDirectory
from kcache.compile.service import address
from kcache.compile.workers.worker import importable_path
from kcache.store.locks import take_file_lock

START_TIMEOUT_S = 20.0  # the server binds its socket before it imports anything heavy
START_POLL_S = 0.02  # how often a process waiting for another's start tries the socket
REQUEST_TIMEOUT_S = 600.0  # a status, stop or waiting warm-up request (the last starts workers)


class ServiceUnavailable(OSError):
    """No compile service could be reached or started (the reason is the message)."""


def connect(name: str) -> tuple[socket.socket, int, bool]:
    """A connection to the running service `name`, its pid, and whether it is warm (a worker ready).
    Raises OSError when none listens."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(START_TIMEOUT_S)
        conn.connect(str(address.socket_path(name)))
        uid = address.peer_uid(conn)
        if uid != os.geteuid():
            raise ServiceUnavailable(f"the socket of {name} is served by uid {uid}, not {os.geteuid()}")
        conn.settimeout(None)  # the wire reads the descriptor, which must block
        wire.send(conn.fileno(), ("hello", name))
        warm = False
        try:
            while True:  # ("warmed",) may come first: the service got warm as this client connected
                greeting = wire.receive_reply(conn.fileno(), START_TIMEOUT_S, "greeting the compile service")
                if greeting[0] == "hello":
                    return conn, greeting[1], warm or greeting[2]
                warm = warm or greeting[0] == "warmed"
        except (TimeoutError, wire.WorkerDied, wire.ReplyUnreadable) as err:
            raise ServiceUnavailable(f"the compile service at {address.socket_path(name)} does not answer: {err}") from None
    except BaseException:
        conn.close()
        raise


def connect_or_start(name: str, workers: int, preload: Iterable[str], idle_s: float) -> tuple[socket.socket, int, bool]:
    """Connect to the service `name`, starting it when none listens (`connect`'s answer). Raises
    ServiceUnavailable.

    Of the processes that find no service at once (a job's ranks opening their caches together), one
    starts it, under its start lock, and the others wait for its socket. Each starting a server of
    its own, 32 ranks started 32 interpreters, 31 of which found the name taken and exited: seconds
    of CPU spent while the one that stays imports TileLang, on which their first compile waits.
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            return connect(name)
        except ServiceUnavailable:
            raise
        except NoServiceDirectory as err:
            raise ServiceUnavailable(str(err)) from err
        except (OSError, EOFError) as err:
            if isinstance(err, OSError) and err.errno not in (errno.ENOENT, errno.ECONNREFUSED, None):
                raise ServiceUnavailable(f"{address.socket_path(name)}: {err}") from err
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"no compile service listens at {address.socket_path(name)}: {err}") from err
        starting = _take_start_lock(name)
        if starting is None:  # another process is starting it: its socket appears within START_TIMEOUT_S
            select.select([], [], [], START_POLL_S)
            continue
        try:
            with contextlib.suppress(OSError, EOFError):
                return connect(name)  # the holder before us started it
            start(name, workers, preload, idle_s)  # then connect; "busy": another server is binding the name
        finally:
            os.close(starting)


def _take_start_lock(name: str) -> int | None:
    """The start lock of service `name`, held (a descriptor to close), or None while another holds it."""
    try:
        return take_file_lock(address.start_lock_path(name))  # an exiting service removes it when free
    except OSError as err:
        raise ServiceUnavailable(f"{address.start_lock_path(name)}: {err}") from err


def start(name: str, workers: int, preload: Iterable[str], idle_s: float) -> None:
    """Start the service `name` and wait until it listens (or says another server has the name)."""
    try:
        log_file = os.open(address.log_path(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o600)
    except OSError as err:
        raise ServiceUnavailable(str(err)) from err
    read_end, write_end = os.pipe()
    try:
        argv = ["--name", name, "--workers", str(workers), "--idle", str(idle_s), "--preload", json.dumps(list(preload)),
                "--ready-fd", str(write_end), "--sys-path", json.dumps(importable_path(sys.path))]
        starter = POPEN(  # bound at import, as the workers' (interpreter.start_interpreter)
            python_command(f"from kcache.compile.service.server_process import run; sys.exit(run({argv!r}))"),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, pass_fds=(write_end,),
            start_new_session=True, cwd="/",  # the service outlives, and serves every, working directory
            env=internal_environment({"PYTHONPATH": os.pathsep.join(importable_path(sys.path))}),
        )
    except OSError as err:
        os.close(read_end)
        raise ServiceUnavailable(f"{sys.executable} could not start the compile service: {err}") from err
    finally:
        os.close(write_end)
        os.close(log_file)
    try:
        starter.wait(START_TIMEOUT_S)  # the server forks and this parent exits at once
        word = os.read(read_end, 16) if wire.readable_within(read_end, START_TIMEOUT_S) else b""
    except subprocess.TimeoutExpired as err:
        raise ServiceUnavailable("the compile service did not start in time") from err
    finally:
        os.close(read_end)
    if word not in (b"ready", b"busy"):
        raise ServiceUnavailable(f"the compile service did not start (see {address.log_path(name)})")


def request(name: str, message: tuple[Any, ...]) -> Any:
    """One request to the running service `name` (status, stop). Raises OSError when none listens."""
    conn, _pid, _warm = connect(name)
    with conn:
        wire.send(conn.fileno(), message)
        try:  # a warm-up that waits for its workers may take as long as a worker's start
            while True:
                reply = wire.receive_reply(conn.fileno(), REQUEST_TIMEOUT_S, f"asking the compile service for {message[0]}")
                if reply[0] != "warmed":  # told to every client, this one too
                    return reply[1]
        except (wire.WorkerDied, wire.ReplyUnreadable) as err:
            raise EOFError(f"the compile service did not answer {message[0]}: {err}") from None

