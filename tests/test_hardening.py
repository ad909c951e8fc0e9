"""Faults any machine can meet (issue 22) never kill or hang the caller: each is a real fault, made on
real files, and a fresh process asks for the kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kcache.store.components import LIBRARY
from kcache.store.manifest import MANIFEST_NAME, build_manifest

PROJECT = Path(__file__).resolve().parent.parent

GET = """
import json, sys, kcache
from stress.kernels import CPU_TARGET, elementwise_add
cache = kcache.KernelCache(sys.argv[1])
cache.get_or_compile(elementwise_add(n=1280), CPU_TARGET, out_idx=[2])
stats = cache.stats()
print("RESULT", json.dumps({"compiles": stats["compiles"], "corrupt": stats["corrupt_entries"]}))
"""


def fresh_get(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", GET, str(root)], capture_output=True, text=True, timeout=600,
                          cwd=str(PROJECT))
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-3000:]}"
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def damage(entry: Path, library: bytes) -> None:
    """Replace the entry's library and rewrite its manifest to match: the sha256 check passes."""
    for name in (LIBRARY, MANIFEST_NAME):
        (entry / name).unlink()
    (entry / LIBRARY).write_bytes(library)
    (entry / MANIFEST_NAME).write_bytes(build_manifest(entry))


def faults(good: bytes) -> dict[str, bytes]:
    other_machine = bytearray(good)
    other_machine[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64
    return {
        "cut to 1/2": good[: len(good) // 2],
        "cut to 1/4": good[: len(good) // 4],
        "cut to 3/4": good[: 3 * len(good) // 4],
        "zero-filled": bytes(len(good)),
        "garbage": os.urandom(len(good)),
        "another machine's": bytes(other_machine),
    }


@pytest.mark.tilelang
def test_a_library_cut_short_or_wrong_with_a_matching_manifest_is_a_corrupt_entry_not_a_dead_process(
        tmp_path: Path) -> None:
    pytest.importorskip("tilelang")
    root = tmp_path / "root"
    assert fresh_get(root) == {"compiles": 1, "corrupt": 0}
    (key,) = os.listdir(root / "kernels")
    entry = root / "kernels" / key
    good = (entry / LIBRARY).read_bytes()

    # The fault is real: loading the half library directly kills a process with SIGBUS.
    half = tmp_path / "half.so"
    half.write_bytes(good[: len(good) // 2])
    probe = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(half)!r})"],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == -signal.SIGBUS, f"dlopen of the half library gave {probe.returncode}, not SIGBUS"

    for name, library in faults(good).items():
        damage(entry, library)
        assert fresh_get(root) == {"compiles": 1, "corrupt": 1}, name  # quarantined, recompiled, no death
        assert fresh_get(root) == {"compiles": 0, "corrupt": 0}, name  # and the next process hits
        quarantined = sorted((root / ".quarantine").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
        assert (quarantined / LIBRARY).read_bytes() == library, name
