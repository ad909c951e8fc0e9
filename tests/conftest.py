"""Shared fixtures. Real faults (tmpfs, read-only mounts) need root; see tests/faults.py."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped, with the reason, where none is visible)")
    config.addinivalue_line("markers", "tilelang: compiles real TileLang kernels (slow: seconds each)")


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    root = tmp_path / "kcache-root"
    root.mkdir()
    return root


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never touch the developer's real caches, TileLang's included.
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "default-kcache"))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tilelang-cache"))
    monkeypatch.delenv("KCACHE_LOCK_TIMEOUT", raising=False)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime directory (XDG_RUNTIME_DIR) of this test's own: the compile services it
    starts are its own, and stopped at its end."""
    from kcache.compile import service_client as client

    directory = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))  # short: a socket's path has 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(directory))
    yield directory
    for socket_file in (directory / "kcache").glob("*.sock"):  # stop what the test left running
        name = socket_file.name.removeprefix("compile-").removesuffix(".sock")
        try:
            client.request(name, ("stop",))
        except (OSError, EOFError):
            pass
    shutil.rmtree(directory, ignore_errors=True)
