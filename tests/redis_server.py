"""A real redis-server for the remote tier's tests: Debian's package, on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start redis-server (no persistence) and yield (url, process); stop it afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    port = _free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert server.stdout is not None
    for line in server.stdout:  # a handshake on its log, not a sleep
        if "Ready to accept connections" in line:
            break
    else:
        raise RuntimeError(f"redis-server exited with status {server.wait()}")
    try:
        yield f"redis://127.0.0.1:{port}/0", server
    finally:
        server.kill()
        server.wait()
