"""Helpers for tests that run fresh interpreters."""

from __future__ import annotations

import json
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


NODE = """
import json, sys, kcache
from stress.programs import synthetic
cache = kcache.KernelCache({root!r}, backend=synthetic, remote={url!r})
print("ready", flush=True); sys.stdin.readline()
for name in {names!r}:
    cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")
print(json.dumps(cache.stats()), flush=True)
"""


def cold_cluster(tmp_path: Path, url: str, names: list[str], procs: int = 16, roots: int = 4,
                 **env: str) -> tuple[list[dict], str]:
    """`procs` fresh processes over `roots` roots sharing the remote tiers `url`, released together to
    get the synthetic kernels `names`: each one's stats, and on failure a line per process that
    compiled or warned (with what it warned)."""
    children = [spawn(NODE.format(root=str(tmp_path / f"node{i % roots}"), url=url, names=names),
                      KCACHE_SYNTHETIC_COMPILE_S="0.5", **env) for i in range(procs)]
    for child in children:
        expect_line(child, "ready")
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    finished = [child.communicate() for child in children]
    stats = [json.loads(out.strip().splitlines()[-1]) for out, _err in finished]
    said = "\n".join(f"{s} {err.strip()[-400:]}" for s, (_out, err) in zip(stats, finished) if s["compiles"] or err.strip())
    return stats, said


LEASE_HOLDER = """
import sys, kcache
from stress.programs import synthetic
def pause(*args, **kwargs):
    print("compiling", flush=True); sys.stdin.readline()
synthetic.compile_entry = pause
synthetic.compile_kernel = pause
kcache.KernelCache({root!r}, backend=synthetic, remote={url!r}).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
"""


def lease_holder(root: Path, url: str, **env: str) -> subprocess.Popen[str]:
    """A process of another node (its own root) that holds the remote compile lease of the synthetic
    kernel "k0": it has begun compiling it, and stays in its compile until its stdin closes or it dies."""
    holder = spawn(LEASE_HOLDER.format(root=str(root), url=url), **env)
    expect_line(holder, "compiling")
    return holder
