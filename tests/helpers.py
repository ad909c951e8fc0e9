"""Helpers for tests that run fresh interpreters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def spawn(code: str, **env: str) -> subprocess.Popen[str]:
    """A fresh interpreter running `code`, with pipes for a line-based handshake."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=child_env(**env), cwd=str(PROJECT),
    )


def expect_line(proc: subprocess.Popen[str], expected: str) -> str:
    """Block until the child prints `expected` (a handshake, not a sleep)."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited before printing {expected!r}: rc={proc.wait()} stderr={proc.stderr.read()}")
        if line.strip() == expected:
            return line


def snapshot(root: Path) -> dict[str, tuple[int, float]]:
    """Every path under the root with its size and mtime."""
    found = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            info = os.stat(os.path.join(current, name), follow_symlinks=False)
            found[os.path.relpath(os.path.join(current, name), root)] = (info.st_size, info.st_mtime_ns)
    return found
