"""docs/security.md's promises, each against the attack that broke it: real users (an attacker,
kcache-a, and a victim, kcache-b, both in the group kcache-share), real symlinks and renames, a
real redis-server. Nothing outside kcache's own directories is deleted or overwritten, no wrong
kernel is served, nothing crashes, and a refusal says why in one warning."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import kcache
from kcache.store import access, layout
from kcache.store.components import LIBRARY
from stress.programs import synthetic

from .faults import needs_root
from .helpers import snapshot
from .test_shared_fs import use_cache
from .unprivileged import UnprivilegedEnv

pytestmark = needs_root


@pytest.fixture
def world_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kcache-security-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def victims_files(env: UnprivilegedEnv) -> Path:
    """The victim's precious files: ~/.ssh, ~/project, ~/work, owned by the victim."""
    home = env.homes["kcache-b"]
    uid, gid = env.users["kcache-b"]
    for name in (".ssh", "project", "work"):
        (home / name).mkdir(exist_ok=True)
        (home / name / "keep.txt").write_text(f"{name} of the victim\n")
        for path in (home / name, home / name / "keep.txt"):
            os.chown(path, uid, gid)
    return home


def cache_of(root: Path) -> kcache.KernelCache:
    return kcache.KernelCache(root, backend=synthetic)


def get(cache: kcache.KernelCache, name: str) -> synthetic.SyntheticKernel:
    return cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")


# ---------------------------------------------------------------- critical: a planted .trash


def test_a_trash_symlink_planted_by_a_group_member_deletes_nothing_of_the_victim(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    env = unprivileged_env
    home = victims_files(env)
    team = world_dir / "team"
    team.mkdir()
    os.chown(team, 0, env.share_gid)
    team.chmod(0o2770)
    group = {"KCACHE_UMASK": "002"}
    first, _ = use_cache(env, "kcache-b", team, ["k0"], **group)  # the victim uses the team root
    assert first["stats"]["compiles"] == 1
    plant = (f"import os\nos.unlink({str(team / layout.GC_STAMP)!r})\n"
             f"os.symlink({str(home)!r}, {str(team / layout.TRASH)!r})\n")
    assert not (team / layout.TRASH).exists() or (team / layout.TRASH).is_dir()
    shutil.rmtree(team / layout.TRASH, ignore_errors=True)
    planted = env.run("kcache-a", plant)
    assert planted.returncode == 0, planted.stderr
    assert (team / layout.TRASH).is_symlink()  # the attack is in place
    before = snapshot(home)
    again, warnings = use_cache(env, "kcache-b", team, ["k0"], "cache.gc()", **group)  # gc at open, and once more
    assert snapshot(home) == before, "the victim's files were touched"
    assert again["stats"]["disk_hits"] == 1
    assert any(str(team / layout.TRASH) in w and "not emptying" in w for w in warnings), warnings


def test_the_fallback_root_is_never_a_directory_another_user_prepared(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    env = unprivileged_env
    home = victims_files(env)
    uid, _gid = env.users["kcache-b"]
    cache_dir = home / ".cache"  # the victim's own cache directory cannot be created: ~/.cache is root's
    cache_dir.mkdir(exist_ok=True)
    os.chown(cache_dir, 0, 0)
    cache_dir.chmod(0o755)
    try:
        _the_fallback_root_is_not_the_prepared_one(env, home, uid, world_dir)
    finally:  # the users' homes serve the whole run (tests/conftest.py): give ~/.cache back to the victim
        shutil.rmtree(cache_dir, ignore_errors=True)


def _the_fallback_root_is_not_the_prepared_one(env: UnprivilegedEnv, home: Path, uid: int, world_dir: Path) -> None:
    tmp = world_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    prepared = tmp / f"kcache-{uid}"  # the name the victim's kcache used to adopt
    made = env.run("kcache-a", f"import os\nos.mkdir({str(prepared)!r})\nos.chmod({str(prepared)!r}, 0o777)\n"
                               f"os.symlink({str(home)!r}, {str(prepared / layout.TRASH)!r})\n")
    assert made.returncode == 0, made.stderr
    before = snapshot(home)
    result, warnings = use_cache(env, "kcache-b", home / ".cache" / "kcache", ["k0"], "cache.gc()",
                                 TMPDIR=str(tmp))
    assert snapshot(home) == before, "the victim's files were touched"
    assert result["stats"]["compiles"] == 1 and result["root"] not in (str(prepared), str(home / ".cache" / "kcache"))
    assert Path(result["root"]).parent == tmp and Path(result["root"]).name.startswith(f"kcache-{uid}-")
    # The prepared directory is also the name of the victim's compile-service directory in that tmp:
    # refused as well, and so is the next place (under ~/.cache, root's here), so the compile ran in
    # the victim's own pool, each with its own warning.
    assert len(warnings) == 2 and "not writable" in warnings[0]
    assert f"{prepared} belongs to uid {env.users['kcache-a'][0]}" in warnings[1] and "own pool" in warnings[1]


def test_gc_deletes_nothing_in_a_directory_that_is_not_a_kcache_root(tmp_path: Path) -> None:
    home = tmp_path / "home"  # KCACHE_DIR=$HOME by mistake: old staging-like names in the user's files
    (home / "notes").mkdir(parents=True)
    stale = home / "project" / ".staging" / f"{'ab' * 16}.{layout.this_host()}.999999999.{'cd' * 16}"
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))
    (home / layout.STAGING).mkdir()
    (home / layout.STAGING / stale.name).mkdir()
    before = snapshot(home)
    cache = cache_of(home)
    report = cache.gc()
    assert report.staging_removed == 0 and not (home / layout.ROOT_MARKER).exists()
    after = snapshot(home)
    assert {p: v for p, v in after.items() if p in before} == before  # nothing of the user's removed or changed


# ---------------------------------------------------------------- links where kcache's own directories go


@pytest.mark.parametrize("planted", [layout.QUARANTINE, layout.LOGS, layout.LOCKS, layout.STATS, layout.STAGING])
def test_a_link_in_place_of_a_kcache_directory_is_never_followed(tmp_path: Path, planted: str) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    cache = cache_of(root)
    get(cache, "k0")
    kernels = root / "kernels"
    (key,) = os.listdir(kernels)
    (elsewhere / "keep").mkdir(parents=True)
    (elsewhere / f"{key}.lock").write_bytes(b"")  # what a lock sweep would unlink
    stale = elsewhere / f"{key}.{layout.this_host()}.999999999.{'cd' * 16}"  # what a staging sweep would delete
    stale.mkdir()
    old = 400 * 86400  # older than anything `kcache gc` keeps in the quarantine
    for item in (elsewhere / "keep", stale):
        os.utime(item, (os.stat(item).st_atime - old, os.stat(item).st_mtime - old))
    shutil.rmtree(root / planted, ignore_errors=True)
    os.symlink(elsewhere, root / planted)
    before = snapshot(elsewhere), os.stat(elsewhere).st_mtime_ns  # a staging made and renamed away shows here
    (kernels / key / LIBRARY).chmod(0o644)
    (kernels / key / LIBRARY).write_bytes(b"corrupt")  # a miss that quarantines, under the lock
    fresh = cache_of(root)
    fresh.settings = __import__("dataclasses").replace(fresh.settings, max_size_bytes=1)
    get(fresh, "k0")
    fresh.gc()
    from kcache.cli.main import main

    assert main(["--dir", str(root), "--json", "gc"]) == 0  # which also prunes old quarantined entries
    from kcache.maintenance.counter_file import _flush_all

    _flush_all()
    assert (snapshot(elsewhere), os.stat(elsewhere).st_mtime_ns) == before
    assert fresh.stats()["compiles"] == 1  # the corrupt entry really sent the call down the miss path


@pytest.mark.parametrize("swapped", [layout.STAGING, "kernels"])
def test_a_link_swapped_in_during_a_publish_is_never_written_or_renamed_through(tmp_path: Path, swapped: str) -> None:
    """The window between the publish's checks and its rename: the directory is renamed away and a link
    put in its place while the compile writes. What the publish made is what it verifies and renames
    (by the descriptors it holds); nothing reaches the link's target."""
    from kcache.store.entries import EntryStore

    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = cache_of(root)
    get(cache, "k1")  # the root and its directories exist
    before = snapshot(elsewhere), os.stat(elsewhere).st_mtime_ns
    fired = []

    def swap(step: str) -> None:
        if step == "staging_created" and not fired:
            os.rename(root / swapped, root / f"{swapped}.moved")
            os.symlink(elsewhere, root / swapped)
            fired.append(step)

    EntryStore.fault_hook = staticmethod(swap)
    try:
        got = get(cache_of(root), "k0")
    finally:
        EntryStore.fault_hook = None
    assert fired and got is not None
    assert (snapshot(elsewhere), os.stat(elsewhere).st_mtime_ns) == before
    moved = root / f"{swapped}.moved"
    if swapped == "kernels":  # the entry landed in the directory the publish held, not through the link
        assert len(os.listdir(moved)) == 2
    else:  # the compile's files went nowhere that was published; the held staging was cleaned up
        assert os.listdir(moved) == []


# ---------------------------------------------------------------- bound to the key


def test_an_entry_copied_under_another_key_is_refused_and_verify_says_so(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cache = cache_of(root)
    k1 = get(cache, "k1")
    get(cache, "k0")
    kernels = root / "kernels"
    key_of = {json.loads((kernels / k / "meta.json").read_text())["kernel"]: k for k in os.listdir(kernels)}
    shutil.rmtree(kernels / key_of["k0"])
    shutil.copytree(kernels / key_of["k1"], kernels / key_of["k0"])  # k1's files, manifest and all, as k0
    fresh = cache_of(root)
    got = get(fresh, "k0")
    assert got.library_sha != k1.library_sha and fresh.stats()["corrupt_entries"] == 1
    assert fresh.stats()["compiles"] == 1
    shutil.rmtree(kernels / key_of["k0"])
    shutil.copytree(kernels / key_of["k1"], kernels / key_of["k0"])
    from kcache.cli.main import main

    assert main(["--dir", str(root), "--json", "verify"]) == 1


def test_a_sparse_huge_library_is_refused_before_it_is_read(tmp_path: Path) -> None:
    root = tmp_path / "root"
    get(cache_of(root), "k0")
    (key,) = os.listdir(root / "kernels")
    library = root / "kernels" / key / LIBRARY
    library.chmod(0o644)
    with open(library, "r+b") as out:
        out.truncate(1 << 40)  # 1 TiB, sparse: reading it would be a MemoryError
    fresh = cache_of(root)
    get(fresh, "k0")
    assert fresh.stats()["corrupt_entries"] == 1 and fresh.stats()["compiles"] == 1


def test_a_root_kcache_creates_is_marked_and_private() -> None:
    root = Path(tempfile.mkdtemp()) / "new-root"
    try:
        access.create_root(root)
        assert (root / layout.ROOT_MARKER).is_file() and (root.stat().st_mode & 0o777) == 0o700
    finally:
        shutil.rmtree(root.parent)


# ---------------------------------------------------------------- the remote tier: a Redis writer


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("redis", reason="the remote tier needs redis-py (pip install -e '.[test]')")
    from .redis_server import redis_server

    with redis_server(tmp_path) as (url, _server):
        yield url


def node(root: Path, url: str, **settings: object) -> kcache.KernelCache:
    import dataclasses

    from kcache.config import Settings

    chosen = dataclasses.replace(Settings.from_env(root), remote_url=url, **settings)
    return kcache.KernelCache(root, settings=chosen, backend=synthetic)


def remote_keys(url: str, secret: str | None = None) -> dict[str, str]:
    """kernel name -> its Redis key, from the values' meta.json."""
    import redis

    from kcache.tiers.redis_tier import unpack

    client = redis.Redis.from_url(url)
    found = {}
    for name in (raw.decode() for raw in client.keys("kcache:*")):
        if ":lease:" not in name:
            files = unpack(client.get(name), frozenset(synthetic.COMPONENTS), secret.encode() if secret else None, name)
            found[json.loads(files["meta.json"])["kernel"]] = name
    return found


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_a_remote_value_replayed_under_another_key_is_refused(tmp_path: Path, redis_url: str,
                                                              secret: str | None, caplog) -> None:
    import redis

    first = node(tmp_path / "a", redis_url, remote_secret=secret)
    k1 = get(first, "k1")
    get(first, "k0")
    keys = remote_keys(redis_url, secret)
    client = redis.Redis.from_url(redis_url)
    client.set(keys["k0"], client.get(keys["k1"]))  # no secret needed to copy a value
    second = node(tmp_path / "b", redis_url, remote_secret=secret)
    got = get(second, "k0")
    assert got.library_sha != k1.library_sha and second.stats()["remote_hits"] == 0
    assert second.stats()["compiles"] == 1
    why = "signature does not verify" if secret else "names the key"
    assert any(why in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_malformed_remote_values_are_refused_with_a_warning_never_raised(tmp_path: Path, redis_url: str,
                                                                         caplog) -> None:
    import redis

    from kcache.tiers.redis_tier import pack

    first = node(tmp_path / "a", redis_url)
    get(first, "k0")
    (key,) = remote_keys(redis_url).values()
    client = redis.Redis.from_url(redis_url)
    good = {name: os.urandom(8) for name in synthetic.COMPONENTS}
    good["meta.json"] = json.dumps({"key": key.rsplit(":", 1)[1]}).encode()
    from kcache.store.manifest import MANIFEST_NAME

    for bad in ({**good, "x\0y": b"1"}, {**good, "extra.so": b"2"}, {"x": b""}):
        listed = dict(bad)
        listed[MANIFEST_NAME] = json.dumps({"format": 1, "files": {
            n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in bad.items()}}).encode()
        client.set(key, pack(listed, None, key))
        fresh = node(tmp_path / f"n{len(bad)}{len(caplog.records)}", redis_url)
        got = get(fresh, "k0")  # no ValueError out of get_or_compile
        assert got is not None and fresh.stats()["remote_hits"] == 0
    refused = [r.getMessage() for r in caplog.records if "ignoring remote entry" in r.getMessage()]
    assert len(refused) >= 3, refused


def test_an_oversized_or_mistyped_remote_value_is_refused_before_it_is_downloaded(tmp_path: Path, redis_url: str,
                                                                                  caplog) -> None:
    import redis

    first = node(tmp_path / "a", redis_url)
    get(first, "k0")
    (key,) = remote_keys(redis_url).values()
    client = redis.Redis.from_url(redis_url)
    cap = 1 << 20
    client.set(key, b"\0" * (8 * cap))  # 8 MiB where the reader accepts 1 MiB

    def sent_by_redis() -> int:
        return int(client.info("stats")["total_net_output_bytes"])

    before = sent_by_redis()
    fresh = node(tmp_path / "b", redis_url, remote_max_entry_bytes=cap)
    got = get(fresh, "k0")
    assert got is not None and fresh.stats()["remote_hits"] == 0 and fresh.stats()["compiles"] == 1
    # The value was measured in Redis, not sent: far less than its 8 MiB left the server (the new upload
    # goes the other way).
    assert sent_by_redis() - before < cap, sent_by_redis() - before
    assert any("not downloaded" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]

    client.delete(key)
    client.hset(key, "field", "planted")  # a hash under an entry's name: refused, Redis not marked down
    other = node(tmp_path / "c", redis_url)
    assert get(other, "k0") is not None and other.stats()["compiles"] == 1
    assert any("where a string value belongs" in r.getMessage() for r in caplog.records)
    tier = other._remote_tier  # noqa: SLF001
    assert tier is not None and tier.available()  # a refused value is not an outage


def test_a_planted_lease_without_expiry_stalls_nobody(tmp_path: Path, redis_url: str, caplog) -> None:
    import time

    import redis

    first = node(tmp_path / "a", redis_url)
    get(first, "k0")
    (key,) = remote_keys(redis_url).values()
    client = redis.Redis.from_url(redis_url)
    client.delete(key)
    lease = key.rsplit(":", 1)[0] + ":lease:" + key.rsplit(":", 1)[1]
    client.set(lease, b"planted")  # no TTL: under the old lease rules every node waited the lock timeout
    assert client.ttl(lease) == -1
    started = time.monotonic()
    fresh = node(tmp_path / "b", redis_url, lock_timeout_s=60.0)
    get(fresh, "k0")
    assert time.monotonic() - started < 30 and fresh.stats()["compiles"] == 1
    assert any("invalid compile lease" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- swap races: check, then use the same bytes

RENAME_EXCHANGE_LOOP = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ours, theirs, stop = {ours!r}, {theirs!r}, {stop!r}
swaps = 0
while not os.path.exists(stop):
    swaps += libc.renameat2(-100, ours.encode(), -100, theirs.encode(), 2) == 0  # AT_FDCWD, RENAME_EXCHANGE
print(swaps)
"""
LOADS = 200


def attacker_loop(env: UnprivilegedEnv, ours: Path, theirs: Path, stop: Path) -> subprocess.Popen[str]:
    uid, gid = env.users["kcache-a"]
    return subprocess.Popen([str(env.python), "-c", RENAME_EXCHANGE_LOOP.format(ours=str(ours), theirs=str(theirs),
                                                                                stop=str(stop))],
                            user=uid, group=gid, extra_groups=[env.share_gid], env={"PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fresh_victims(env: UnprivilegedEnv, code: str, count: int) -> list[subprocess.CompletedProcess[str]]:
    """`count` fresh victim processes, a few at a time."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda _: env.run("kcache-b", code, timeout=60), range(count)))


def shared_dir(path: Path, env: UnprivilegedEnv, owner: str, mode: int) -> Path:
    path.mkdir()
    os.chown(path, env.users[owner][0], env.share_gid)
    path.chmod(mode)
    return path


def test_swapping_kernel_entries_during_fresh_loads_never_serves_the_attackers(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    env = unprivileged_env
    root = shared_dir(world_dir / "victim-root", env, "kcache-b", 0o750)  # the group may look, not write
    kernels = shared_dir(root / "kernels", env, "kcache-b", 0o770)  # ...but here it may (umask 002, say)
    load = (f"import logging, kcache\nfrom stress.programs import synthetic\nlogging.disable(logging.WARNING)\n"
            f"print(kcache.KernelCache({str(root)!r}, backend=synthetic)"
            f".get_or_compile(synthetic.SyntheticFunc('k0'), 'synthetic').library_sha)")
    first = env.run("kcache-b", load)
    assert first.returncode == 0, first.stderr
    (key,) = [name for name in os.listdir(kernels) if layout.is_key(name)]
    forge = f"""
import hashlib, os, shutil
from pathlib import Path
from kcache.store.manifest import build_manifest
real, fake = Path({str(kernels / key)!r}), Path({str(kernels / 'fake')!r})
fake.mkdir()
for item in real.iterdir():
    if item.name != "manifest.json":
        shutil.copyfile(item, fake / item.name)
(fake / "kernel.so").write_bytes(b"the attacker's code")
(fake / "manifest.json").write_bytes(build_manifest(fake))
print(hashlib.sha256(b"the attacker's code").hexdigest())
"""
    forged = env.run("kcache-a", forge)
    assert forged.returncode == 0, forged.stderr
    attackers = forged.stdout.split()[-1]
    stop = world_dir / "stop"
    attacker = attacker_loop(env, kernels / key, kernels / "fake", stop)
    try:
        victims = fresh_victims(env, load, LOADS)
    finally:
        stop.touch()
        swaps = int(attacker.communicate(timeout=60)[0].split()[-1])
    assert swaps > LOADS  # the swap loop really ran during the loads
    assert all(v.returncode == 0 for v in victims), [v.stderr for v in victims if v.returncode][:1]
    shas = [v.stdout.split()[-1] for v in victims]
    assert shas.count(attackers) == 0


def test_swapping_autotune_results_during_fresh_loads_never_unpickles_the_attackers(
    unprivileged_env: UnprivilegedEnv, world_dir: Path  # noqa: F811
) -> None:
    env = unprivileged_env
    shared_dir(world_dir / "markers", env, "kcache-a", 0o777)
    results = shared_dir(world_dir / "results", env, "kcache-b", 0o770)
    save = (f"from kcache.results.autotune import AutotuneResult\n"
            f"AutotuneResult(config={{'block': 64}}, latency=1.0).save_to_disk({str(results / 'r')!r})")
    saved = env.run("kcache-b", save)
    assert saved.returncode == 0, saved.stderr
    marker = world_dir / "markers" / "ran"
    forge = f"""
import shutil
from pathlib import Path
import cloudpickle
from kcache.store.manifest import build_manifest
class Payload:
    def __reduce__(self):
        return (open, ({str(marker)!r}, "w"))
real, fake = Path({str(results / 'r')!r}), Path({str(results / 'fake')!r})
fake.mkdir()
for item in real.iterdir():
    if item.name != "manifest.json":
        shutil.copyfile(item, fake / item.name)
(fake / "function.pkl").write_bytes(cloudpickle.dumps(Payload()))
(fake / "manifest.json").write_bytes(build_manifest(fake))
"""
    forged = env.run("kcache-a", forge)
    assert forged.returncode == 0, forged.stderr
    load = (f"import logging\nfrom kcache.results.autotune import AutotuneResult\nlogging.disable(logging.WARNING)\n"
            f"r = AutotuneResult.load_from_disk({str(results / 'r')!r})\nprint(r is not None)")
    stop = world_dir / "stop"
    attacker = attacker_loop(env, results / "r", results / "fake", stop)
    try:
        victims = fresh_victims(env, load, LOADS)
    finally:
        stop.touch()
        swaps = int(attacker.communicate(timeout=60)[0].split()[-1])
    assert swaps > LOADS
    assert all(v.returncode == 0 for v in victims), [v.stderr for v in victims if v.returncode][:1]
    assert not marker.exists(), "a victim unpickled the attacker's payload"


def test_a_planted_toolchain_memo_is_not_believed(tmp_path: Path) -> None:
    from kcache.errors import UntrustedEntry
    from kcache.store import trust

    root = tmp_path / "root"
    access.create_root(root)
    (root / layout.TOOLCHAIN).mkdir()
    memo = root / layout.TOOLCHAIN / "sig.json"
    memo.write_text('{"tilelang": "forged"}')
    assert trust.read_trusted(root, Path(layout.TOOLCHAIN), "sig.json", 1 << 20) == b'{"tilelang": "forged"}'
    os.chown(memo, 12345, 12345)  # another user's file
    with pytest.raises(UntrustedEntry, match="owned by uid 12345"):
        trust.read_trusted(root, Path(layout.TOOLCHAIN), "sig.json", 1 << 20)


def test_doctor_fix_leaves_a_shared_tmp_alone(tmp_path: Path) -> None:
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    (shared_tmp / "other-users-file").write_text("x")
    kcache.doctor(shared_tmp, fix=True)
    assert shared_tmp.stat().st_mode & 0o7777 == 0o1777
