"""The remote tier's tests get a real redis-server from stress.servers.redis; none on PATH is a skip."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stress.servers import redis as _server


@contextmanager
def redis_server(workdir: Path, credentials: tuple[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """stress.servers.redis.redis_server, skipping the test (with the reason) where redis-server is missing."""
    try:
        _server.find_redis_server()
    except _server.RedisServerMissing as missing:
        pytest.skip(f"{missing}; .ci/run installs it")
    with _server.redis_server(workdir, credentials) as running:
        yield running
