"""Shared and hostile filesystems under real conditions: a root of another user (real EACCES, as an
unprivileged user), a group-shared root used by two users, a root that turns read-only after it
opened, and what `kcache.doctor` says of each. noexec mounts: tests/test_noexec.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import kcache
from stress.programs import synthetic

from .faults import needs_root, readonly_bind
from .helpers import snapshot
from .unprivileged import UnprivilegedEnv

# Run as a user: use the cache, print one JSON line of what happened; warnings go to stderr.
USE_CACHE = """
import json, logging, sys, kcache
from stress.programs import synthetic
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
try:
    cache = kcache.KernelCache({root!r}, backend=synthetic)
except kcache.UnwritableCache as err:
    print(json.dumps({{"error": str(err), "permission_error": isinstance(err, PermissionError)}}))
    raise SystemExit(0)
shas = {{name: cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic").library_sha for name in {names!r}}}
{extra}
print(json.dumps({{"shas": shas, "stats": cache.stats(), "root": str(cache.root), "readonly": cache.readonly,
                  "read_roots": [str(r) for r in cache.read_roots]}}))
"""


def use_cache(env: UnprivilegedEnv, user: str, root: Path, names: list[str], extra: str = "",
              **variables: str) -> tuple[dict, list[str]]:
    done = env.run(user, USE_CACHE.format(root=str(root), names=names, extra=extra), env=variables)
    assert done.returncode == 0, done.stderr  # no PermissionError, or any other, escaped
    warnings = [line for line in done.stderr.splitlines() if line.startswith("kcache:")]
    return json.loads(done.stdout.strip().splitlines()[-1]), warnings


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp_path is 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="kcache-shared-fs-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def roots_shared_root(world_dir: Path) -> tuple[Path, str]:
    """A root made by root, mode 0755 (the nightly-CI case), holding one published kernel k0."""
    root = world_dir / "ci-cache"
    made = kcache.KernelCache(root, backend=synthetic).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    from kcache.maintenance.counter_file import _flush_all

    _flush_all()
    for current, dirs, _files in os.walk(root):
        for name in [".", *dirs]:
            os.chmod(os.path.join(current, name), 0o755)
    return root, made.library_sha


def test_a_root_of_another_user_is_read_and_new_kernels_go_to_a_per_user_root(
    unprivileged_env: UnprivilegedEnv, roots_shared_root: tuple[Path, str]  # noqa: F811
) -> None:
    root, k0_sha = roots_shared_root
    before = snapshot(root)
    fallback = unprivileged_env.homes["kcache-a"] / ".cache" / "kcache"
    shutil.rmtree(fallback, ignore_errors=True)  # the homes last the session
    result, warnings = use_cache(unprivileged_env, "kcache-a", root, ["k0", "k1"])
    assert result["read_roots"] == [str(fallback), str(root)] and result["root"] == str(fallback)
    assert result["shas"]["k0"] == k0_sha  # the shared root's hit, after the trust check
    assert (result["stats"]["disk_hits"], result["stats"]["compiles"]) == (1, 1)
    assert len(warnings) == 1, warnings
    for words in (str(root), "root (uid 0)", "drwxr-xr-x", str(fallback), "KCACHE_UMASK=002"):
        assert words in warnings[0]
    assert snapshot(root) == before  # nothing written, nothing half-published in the shared root
    assert len(os.listdir(fallback / "kernels")) == 1

    again, _ = use_cache(unprivileged_env, "kcache-a", root, ["k0", "k1"])
    assert (again["stats"]["disk_hits"], again["stats"]["compiles"]) == (2, 0)  # k1 from the fallback root


def test_readonly_and_error_policies_for_a_root_of_another_user(
    unprivileged_env: UnprivilegedEnv, roots_shared_root: tuple[Path, str]  # noqa: F811
) -> None:
    root, k0_sha = roots_shared_root
    before = snapshot(root)
    shutil.rmtree(unprivileged_env.homes["kcache-b"] / ".cache", ignore_errors=True)  # the homes last the session
    result, warnings = use_cache(unprivileged_env, "kcache-b", root, ["k0", "k1"], KCACHE_ON_UNWRITABLE="readonly")
    assert result["readonly"] and result["shas"]["k0"] == k0_sha
    assert (result["stats"]["disk_hits"], result["stats"]["compiles"]) == (1, 1)
    assert len(warnings) == 1 and "read-only" in warnings[0]
    assert not (unprivileged_env.homes["kcache-b"] / ".cache").exists()  # no fallback root either

    failed, _ = use_cache(unprivileged_env, "kcache-b", root, [], KCACHE_ON_UNWRITABLE="error")
    assert failed["permission_error"]
    for words in (str(root), "root (uid 0)", "drwxr-xr-x", "KCACHE_DIR", "KCACHE_UMASK=002"):
        assert words in failed["error"]
    assert snapshot(root) == before


def test_a_group_shared_root_is_written_and_read_by_two_users(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    env = unprivileged_env
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, 0, env.share_gid)
    team.chmod(0o2770)
    group = {"KCACHE_UMASK": "002"}
    describe = f"""
import os, stat
from pathlib import Path
root = Path({str(team)!r})
entry = next((root / "kernels").iterdir())
lock = next((root / ".locks").iterdir())
shas["modes"] = {{"entry": oct(stat.S_IMODE(os.stat(entry).st_mode)), "entry_gid": os.stat(entry).st_gid,
                 "file": oct(stat.S_IMODE(os.stat(entry / "kernel.so").st_mode)),
                 "lock": oct(stat.S_IMODE(os.stat(lock).st_mode))}}
"""
    first, warnings = use_cache(env, "kcache-a", team, ["k0"], describe, **group)
    assert warnings == [] and first["stats"]["compiles"] == 1
    # Setgid directories the group can write (eviction renames them), files nobody can write.
    assert first["shas"]["modes"] == {"entry": "0o2775", "entry_gid": env.share_gid, "file": "0o444", "lock": "0o664"}

    second, warnings = use_cache(env, "kcache-b", team, ["k0", "k1"], **group)
    assert warnings == [] and second["shas"]["k0"] == first["shas"]["k0"]  # a's entry, trusted through the group
    assert (second["stats"]["disk_hits"], second["stats"]["compiles"]) == (1, 1)
    third, _ = use_cache(env, "kcache-a", team, ["k1"], **group)
    assert third["shas"]["k1"] == second["shas"]["k1"] and third["stats"]["compiles"] == 0

    # Outside group mode, a root the group can write (so another member could swap its entries) is
    # not trusted: compiled privately, never loaded.
    private, warnings = use_cache(env, "kcache-b", team, ["k0"])
    assert private["stats"]["compiles"] == 1 and private["shas"]["k0"] != first["shas"]["k0"]
    assert any("not loading" in w and "writable by group" in w and "outside group mode" in w for w in warnings)

    # Any member may evict any member's entries: b prunes everything a and b published.
    evict = "cache.settings = __import__('dataclasses').replace(cache.settings, max_size_bytes=1); cache.gc()"
    use_cache(env, "kcache-b", team, [], evict, **group)
    assert os.listdir(team / "kernels") == []

    # A root a member creates in group mode is 2770.
    use_cache(env, "kcache-a", team / "nested", ["k0"], **group)
    assert stat.S_IMODE(os.stat(team / "nested").st_mode) == 0o2770


@needs_root
def test_a_root_that_turns_read_only_after_it_opened_still_returns_the_kernel(cache_root: Path, caplog) -> None:
    cache = kcache.KernelCache(cache_root, backend=synthetic)
    (cache_root / ".locks").mkdir()
    with readonly_bind(cache_root), caplog.at_level(logging.WARNING, logger="kcache"):
        kernel = cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    assert len(kernel.library_sha) == 64 and cache.stats()["compiles"] == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot take the compile lock" in warnings[0] and "Read-only" in warnings[0]
    assert not (cache_root / "kernels").exists() and not os.listdir(cache_root / ".locks")


def test_doctor_reports_a_root_of_another_user_and_what_kcache_will_do(
    unprivileged_env: UnprivilegedEnv, roots_shared_root: tuple[Path, str]  # noqa: F811
) -> None:
    root, _ = roots_shared_root
    code = f"""
import json, kcache
print(json.dumps({{f.check: [f.problem, f.detail, f.fix] for f in kcache.doctor({str(root)!r})}}))
"""
    done = unprivileged_env.run("kcache-a", code)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    problem, detail, fix = found["writable"]
    assert problem and "root (uid 0)" in detail and "writes new kernels to" in detail and "KCACHE_UMASK" in fix
    assert found["trust"][0] is False  # root's directories are trusted: hits load from it


def test_doctor_reports_group_mode_problems(world_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    team = world_dir / "team"
    team.mkdir(mode=0o770)
    team.chmod(0o770)  # group-writable, not setgid
    found = {f.check: f for f in kcache.doctor(team)}
    assert not found["group"].problem and "KCACHE_UMASK is not set" in found["group"].detail  # a hint only
    monkeypatch.setenv("KCACHE_UMASK", "002")
    found = {f.check: f for f in kcache.doctor(team)}
    assert found["group"].problem and "not setgid" in found["group"].detail
    team.chmod(0o2770)
    assert not {f.check: f for f in kcache.doctor(team)}["group"].problem
    monkeypatch.setenv("KCACHE_UMASK", "8")
    with pytest.raises(ValueError, match="KCACHE_UMASK"):
        kcache.KernelCache(team, backend=synthetic)


def test_a_new_root_is_private_and_published_files_are_read_only(tmp_path: Path) -> None:
    cache = kcache.KernelCache(tmp_path / "fresh" / "root", backend=synthetic)
    cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    assert stat.S_IMODE(os.stat(cache.root).st_mode) == 0o700
    (entry,) = (cache.root / "kernels").iterdir()
    assert {stat.S_IMODE(f.stat().st_mode) for f in entry.iterdir()} == {0o444}
