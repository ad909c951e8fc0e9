"""The object-storage tier's tests get a real S3-protocol server process from stress.servers.s3; where
moto's server is not installed, the test is skipped with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stress.servers import s3 as _server


@contextmanager
def s3_server() -> Iterator[_server.S3Server]:
    """stress.servers.s3.s3_server, skipping the test (with the reason) where moto is missing."""
    try:
        _server.check_installed()
    except _server.S3ServerMissing as missing:
        pytest.skip(f"{missing}; .ci/run installs it")
    with _server.s3_server() as running:
        yield running
