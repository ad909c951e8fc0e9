"""Real faults for tests: tiny and noexec tmpfs mounts, read-only bind mounts.

These need root (CI and the development machine run as root). Elsewhere the
tests that use them are skipped with that reason; nothing is mocked instead.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs or a read-only bind mount needs root")


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _mount(*cmd: str) -> None:
    """Mount, or skip the test where this sandbox forbids mounting even for root."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(cmd)}: {done.stderr.strip()})")


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m", options: str = "") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (f",{options}" if options else "")
    _mount("mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path))
    try:
        yield path
    finally:
        _run("umount", "-l", str(path))


@contextlib.contextmanager
def readonly_bind(path: Path) -> Iterator[Path]:
    """Make `path` a read-only view of itself (a real EROFS for writers)."""
    _mount("mount", "--bind", str(path), str(path))
    try:
        _run("mount", "-o", "remount,bind,ro", str(path))
        yield path
    finally:
        _run("umount", "-l", str(path))


def fill_filesystem(directory: Path, leave_bytes: int) -> Path:
    """Write a filler file so that about `leave_bytes` stay free; return it."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    filler = directory / "filler.bin"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(free - leave_bytes, 0))
    return filler
