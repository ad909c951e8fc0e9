"""Shared fixtures. Real faults (tmpfs, read-only mounts) need root; see tests/faults.py."""

from __future__ import annotations

import os
import sys
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
