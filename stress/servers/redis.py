"""A real redis-server on a free loopback port, for the remote tier's benchmark and tests.

No pytest here: a missing redis-server raises `RedisServerMissing`, which callers turn into a
skip (`python -m stress.bench` prints one line; tests/redis_server.py makes it a pytest skip).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

INSTALL_HINT = "apt-get install redis-server"


class RedisServerMissing(RuntimeError):
    """redis-server is not on PATH; the message says what to install."""


def find_redis_server() -> str:
    """The path of redis-server on PATH, or RedisServerMissing."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerMissing(f"redis-server not found on PATH ({INSTALL_HINT})")
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def redis_server(workdir: Path, credentials: tuple[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start redis-server (no persistence) and yield (url, process); stop it afterwards. With
    `credentials` (user, password), only that user may do anything (the default user is off), and the
    URL carries both: redis://USER:PASSWORD@127.0.0.1:PORT/0."""
    binary = find_redis_server()
    port = _free_port()
    access = [] if credentials is None else [
        "--user", credentials[0], "on", f">{credentials[1]}", "~*", "&*", "+@all", "--user", "default", "off"]
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), *access],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert server.stdout is not None
    for line in server.stdout:  # a handshake on its log, not a sleep
        if "Ready to accept connections" in line:
            break
    else:
        raise RuntimeError(f"redis-server exited with status {server.wait()}")
    userinfo = "" if credentials is None else f"{credentials[0]}:{credentials[1]}@"
    try:
        yield f"redis://{userinfo}127.0.0.1:{port}/0", server
    finally:
        server.kill()
        server.wait()
