"""Stale staging cleanup (everywhere under the root) and the gc rate limit."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from kcache.config import Settings
from kcache.maintenance.gc import collect_garbage, staging_is_stale
from kcache.maintenance.gc_stamp import gc_is_due
from kcache.store.access import create_root
from kcache.store.layout import StagingName, this_host

KEY = "12" * 32


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def make_staging(area: Path, host: str, pid: int, age_s: float = 0.0) -> Path:
    path = area / str(StagingName(KEY, host, pid, os.urandom(4).hex()))
    path.mkdir(parents=True)
    (path / "kernel.so").write_bytes(b"partial")
    if age_s:
        past = time.time() - age_s
        os.utime(path, (past, past))
    return path


def test_dead_local_owner_is_removed_at_once_live_one_is_kept(cache_root: Path) -> None:
    area = cache_root / ".staging"
    dead = make_staging(area, this_host(), dead_pid())
    alive = make_staging(area, this_host(), os.getppid())
    report = collect_garbage(cache_root, staging_ttl_s=3600)
    assert report.staging_removed == 1
    assert not dead.exists() and alive.exists()


def test_other_hosts_staging_waits_for_the_ttl(cache_root: Path) -> None:
    area = cache_root / ".staging"
    fresh = make_staging(area, "some_other_node", 1)
    old = make_staging(area, "some_other_node", 1, age_s=7200)
    collect_garbage(cache_root, staging_ttl_s=3600)
    assert fresh.exists() and not old.exists()


def test_a_reused_local_pid_older_than_the_ttl_is_garbage() -> None:
    name = str(StagingName(KEY, this_host(), os.getppid(), "x"))
    assert not staging_is_stale(name, age_s=10, ttl_s=3600, host=this_host())
    assert staging_is_stale(name, age_s=7200, ttl_s=3600, host=this_host())


def test_cleanup_covers_the_autotuner_subtree_and_nested_staging(cache_root: Path) -> None:
    create_root(cache_root)  # marked as kcache's before anything else is in it
    nested = [cache_root / "autotuner" / ".staging", cache_root / "some" / "deeper" / ".staging"]
    leftovers = [make_staging(area, this_host(), dead_pid()) for area in nested]
    # An entry directory is never descended into (they hold only files).
    entry_like = cache_root / "kernels" / KEY / ".staging"
    entry_like.mkdir(parents=True)
    collect_garbage(cache_root, staging_ttl_s=3600)
    assert not any(p.exists() for p in leftovers)
    assert entry_like.exists()


def test_gc_at_open_is_rate_limited(cache_root: Path) -> None:
    assert gc_is_due(cache_root, interval_s=3600)
    assert not gc_is_due(cache_root, interval_s=3600)
    assert gc_is_due(cache_root, interval_s=0)


def test_opening_a_cache_cleans_dead_writers_staging(cache_root: Path) -> None:
    from kcache import KernelCache

    leftover = make_staging(cache_root / "autotuner" / ".staging", this_host(), dead_pid())
    KernelCache(cache_root, settings=Settings(root=cache_root, gc_interval_s=0))
    assert not leftover.exists()


def test_settings_come_from_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "x"))
    monkeypatch.setenv("KCACHE_LOCK_TIMEOUT", "12.5")
    monkeypatch.setenv("KCACHE_STAGING_TTL", "60")
    settings = Settings.from_env()
    assert (settings.root, settings.lock_timeout_s, settings.staging_ttl_s) == (tmp_path / "x", 12.5, 60.0)
    monkeypatch.setenv("KCACHE_LOCK_TIMEOUT", "soon")
    try:
        Settings.from_env()
    except ValueError as err:
        assert "KCACHE_LOCK_TIMEOUT" in str(err)
    else:
        raise AssertionError("a bad KCACHE_LOCK_TIMEOUT was accepted")
