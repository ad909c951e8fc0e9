"""The `kcache` command line, on a populated root with a corrupt entry and a partial write."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcache.maintenance.eviction import scan_entries

from .helpers import PROJECT, child_env
from .test_eviction import POPULATE


def kcache_cli(root: Path, *args: str) -> tuple[int, object]:
    """Run `python -m kcache --json` in a fresh interpreter; (exit status, parsed output)."""
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), "--json", *args],
                          capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), check=False)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def populated(cache_root: Path) -> dict:
    names = [f"k{i}" for i in range(6)]
    subprocess.run([sys.executable, "-c", POPULATE.format(root=str(cache_root), names=names)],
                   env=child_env(), cwd=str(PROJECT), check=True, capture_output=True)
    entries = sorted(scan_entries(cache_root), key=lambda e: e.key)
    corrupt = entries[0]
    library = corrupt.path / "kernel.so"
    data = library.read_bytes()
    library.write_bytes(data[:100])  # truncated
    partial = cache_root / ".staging" / f"{'ab' * 16}.{os.uname().nodename}.999999999.deadbeef"
    partial.mkdir(parents=True)
    (partial / "kernel.so").write_bytes(b"half")
    return {"keys": [e.key for e in entries], "corrupt": corrupt.key, "size": entries[1].size}


def test_stats_ls_show(cache_root: Path, populated: dict) -> None:
    status, stats = kcache_cli(cache_root, "stats")
    assert status == 0 and stats["entries"] == 6 and stats["compiles"] == 6 and stats["misses"] == 6
    status, listing = kcache_cli(cache_root, "ls")
    assert status == 0 and sorted(e["key"] for e in listing) == populated["keys"]
    assert {e["kernel"] for e in listing} == {f"k{i}" for i in range(6)}
    key = populated["keys"][1]
    status, shown = kcache_cli(cache_root, "show", key[:10])
    assert status == 0 and shown["key"] == key and shown["meta"]["kernel"] in {e["kernel"] for e in listing}
    assert set(shown["manifest"]["files"]) >= {"kernel.so", "host.cu"}
    assert all(Path(p).is_file() for p in shown["sources"].values())
    status, missing = kcache_cli(cache_root, "show", "ffffffff")
    assert status == 1 and "no entry" in missing["error"]


def test_verify_reports_then_repairs_the_corrupt_entry(cache_root: Path, populated: dict) -> None:
    status, report = kcache_cli(cache_root, "verify")
    assert status == 1 and [b["key"] for b in report["bad"]] == [populated["corrupt"]]
    assert report["staging_in_progress"] == 1  # the partial write: never visible as an entry
    status, report = kcache_cli(cache_root, "verify", "--repair")
    assert status == 0 and report["bad"][0]["quarantined"]
    status, report = kcache_cli(cache_root, "verify")
    assert status == 0 and (report["entries"], report["bad"]) == (5, [])


def test_gc_prune_and_clear(cache_root: Path, populated: dict) -> None:
    status, report = kcache_cli(cache_root, "gc")
    assert status == 0 and report["staging_removed"] == 1 and report["stats_folded"] == 1
    now = time.time()
    for rank, key in enumerate(populated["keys"]):
        os.utime(cache_root / "kernels" / key, (now - 10 * rank, now - 10 * rank))  # the first key is the newest
    status, report = kcache_cli(cache_root, "prune", "--max-size", str(2 * populated["size"] + 10))
    assert status == 0 and (report["evicted"], report["remaining"]) == (4, 2)
    assert sorted(e.key for e in scan_entries(cache_root)) == populated["keys"][:2]
    status, report = kcache_cli(cache_root, "clear")  # synthetic entries name no TileLang version: kept
    assert status == 0 and report["removed_entries"] == 0
    status, report = kcache_cli(cache_root, "clear", "--all-versions")
    assert status == 0 and report["removed_entries"] == 2 and scan_entries(cache_root) == []


def test_doctor_finds_and_fixes_a_world_writable_root(cache_root: Path, populated: dict) -> None:
    status, findings = kcache_cli(cache_root, "doctor")
    by_check = {f["check"]: f for f in findings}
    assert by_check["leftovers"]["problem"]  # the partial write's staging
    cache_root.chmod(0o777)
    status, findings = kcache_cli(cache_root, "doctor")
    assert status == 1 and {f["check"]: f for f in findings}["mode"]["problem"]
    status, findings = kcache_cli(cache_root, "doctor", "--fix")
    assert not stat.S_IMODE(cache_root.stat().st_mode) & stat.S_IWOTH
    assert all(f["fixed"] for f in findings if f["problem"] and f["check"] in ("mode", "leftovers"))
    status, findings = kcache_cli(cache_root, "doctor")
    assert [f["check"] for f in findings if f["problem"]] in ([], ["toolchain"])
    assert status == (1 if any(f["problem"] for f in findings) else 0)


def test_the_cli_never_imports_tilelang_and_stats_works_on_an_empty_root(tmp_path: Path) -> None:
    code = ("import sys, contextlib, io\nfrom kcache.tools.cli import main\n"
            f"for cmd in (['stats'], ['ls'], ['verify'], ['gc'], ['doctor'], ['prune']):\n"
            f"    with contextlib.redirect_stdout(io.StringIO()):\n"
            f"        main(['--dir', {str(tmp_path / 'root')!r}, *cmd])\n"
            "print('tilelang' in sys.modules, 'tvm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                          cwd=str(PROJECT), check=True)
    assert done.stdout.split() == ["False", "False"]
