"""The S3 tier against a real S3-protocol server process (moto's S3 service, stress.servers.s3): nodes
share kernels through a bucket, compile once, store identical files once, and survive a killed
writer, corrupt objects, a wrong secret, a store that goes away and a slow one."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("obstore", reason="the S3 tier needs obstore (pip install -e '.[test]')")

import obstore  # noqa: E402

import kcache  # noqa: E402
from kcache.config import Settings  # noqa: E402
from kcache.tiers.s3_bucket import open_bucket  # noqa: E402
from kcache.tiers.s3_tier import S3Tier  # noqa: E402
from stress.programs import synthetic  # noqa: E402

from .helpers import cold_cluster, expect_line, spawn  # noqa: E402
from .redis_server import redis_server  # noqa: E402
from .s3_server import s3_server  # noqa: E402


@pytest.fixture(scope="module")
def server():
    with s3_server() as running:
        yield running


@pytest.fixture
def s3(server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix of the module's bucket (one test's share of it), with the client's environment set."""
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return server.url(f"t-{uuid.uuid4().hex[:12]}")


def node(root: Path, url: str, **settings) -> kcache.KernelCache:
    chosen = dataclasses.replace(Settings.from_env(root), remote_url=url, **settings)
    return kcache.KernelCache(root, settings=chosen, backend=synthetic)


def get(cache: kcache.KernelCache, name: str = "k0", **options):
    return cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic", **options)


def objects(url: str, under: str = "") -> dict[str, int]:
    """Every object of the prefix of `url` (the test may LIST; kcache never does), with its size."""
    store = open_bucket(url)
    return {meta["path"]: meta["size"] for batch in obstore.list(store, prefix=under or None) for meta in batch}


def entry_names(url: str) -> list[str]:
    return [name for name in objects(url) if "/entries/" in name]


def test_a_second_node_gets_the_kernel_from_the_bucket_with_no_compile(tmp_path: Path, s3: str) -> None:
    first, second = node(tmp_path / "a", s3), node(tmp_path / "b", s3)
    made = get(first)
    assert (first.stats()["compiles"], first.stats()["uploads"]) == (1, 1)
    fetched = get(second)
    assert (second.stats()["compiles"], second.stats()["remote_hits"], second.stats()["s3_hits"]) == (0, 1, 1)
    assert fetched.library_sha == made.library_sha  # the same bytes on both nodes
    assert second.store.keys() == first.store.keys()  # published locally through the staging protocol
    stored = objects(s3)
    # Five blobs: meta.json is inside the entry's manifest, manifest.json is made from it.
    assert len(entry_names(s3)) == 1 and sum(name.startswith("blobs/") for name in stored) == 5


def test_identical_files_of_sixteen_entries_are_stored_once(tmp_path: Path, s3: str) -> None:
    """16 entries under 16 keys whose device code, host code, cubin, library and params are the same
    bytes (one kernel under 16 keys: the same code with options that change nothing): those five are
    stored once, as the compiled entry's blobs; meta.json, which names the key, lives in each entry's
    manifest. Every entry still reads back whole on a fresh node."""
    import hashlib

    from kcache.store.manifest import MANIFEST_NAME, format_manifest

    cache = node(tmp_path / "a", s3)
    get(cache)
    (key,) = cache.store.keys()
    shared = {name: data for name, data in cache.store.read_with_manifest(key).items()
              if name not in (MANIFEST_NAME, "meta.json")}
    tier = cache._remote(synthetic).tiers[0]
    keys = [hashlib.sha256(f"variant {i}".encode()).hexdigest() for i in range(16)]
    for variant in keys:
        files = {**shared, "meta.json": json.dumps({"key": variant, "kernel": "k0"}).encode()}
        files[MANIFEST_NAME] = format_manifest({n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()})
        assert tier.put(variant, files)
    blobs = {name: size for name, size in objects(s3).items() if name.startswith("blobs/")}
    assert len(entry_names(s3)) == 17  # the compiled one and the 16
    assert len(blobs) == 5  # the compiled entry's, shared by all 16
    assert sum(blobs.values()) == sum(len(data) for data in shared.values())
    logical = 16 * sum(len(data) for data in shared.values())
    print(f"16 entries share {logical} bytes of files; the bucket holds {sum(blobs.values())} bytes of blobs")
    reader = S3Tier(s3, tier._space.replace("/", ":"), tier.required)
    assert all(reader.get(variant) is not None for variant in keys)


def test_sixteen_processes_on_four_roots_compile_each_key_once(tmp_path: Path, server, s3: str) -> None:
    """S3 alone: the cluster's single flight is the lease object (create-only), the publish point the
    manifest (create-only)."""
    names = ["k0", "k1", "k2"]
    stats, said = cold_cluster(tmp_path, s3, names, **server.env)
    assert sum(s["compiles"] for s in stats) == len(names), said
    assert sum(s["s3_hits"] for s in stats) == 3 * len(names), said  # each other root fetched each key once
    assert len(entry_names(s3)) == len(names)


def test_a_writer_killed_between_its_blobs_and_its_manifest_leaves_no_entry(tmp_path: Path, server, s3: str,
                                                                             caplog) -> None:
    writer = spawn(f"""
import sys, kcache
from kcache.tiers import s3_tier
from stress.programs import synthetic
def stop_before_the_manifest(self, key, *listing_and_files):
    print("blobs stored", flush=True); sys.stdin.readline()
s3_tier.S3Tier._write_manifest = stop_before_the_manifest
kcache.KernelCache({str(tmp_path / "a")!r}, backend=synthetic, remote={s3!r}).get_or_compile(
    synthetic.SyntheticFunc("k0"), "synthetic")
""", **server.env)
    expect_line(writer, "blobs stored")  # the fault fired: blobs up, no manifest
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    orphans = objects(s3)
    assert orphans and not entry_names(s3)  # invisible: nothing lists these blobs
    reader = node(tmp_path / "b", s3)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(reader)  # no entry: it takes the dead writer's lease at once (same host, pid gone), compiles, publishes
    assert any(f":{writer.pid}' on this host is gone" in r.getMessage() for r in caplog.records)
    assert (reader.stats()["compiles"], reader.stats()["uploads"]) == (1, 1)
    third = node(tmp_path / "c", s3)
    get(third)
    assert (third.stats()["compiles"], third.stats()["s3_hits"]) == (0, 1)


def flip_a_byte(url: str, name: str) -> None:
    store = open_bucket(url)
    data = bytearray(bytes(obstore.get(store, name).bytes()))
    data[len(data) // 2] ^= 0xFF
    obstore.put(store, name, bytes(data))


def test_a_corrupt_blob_is_detected_recompiled_and_rewritten(tmp_path: Path, s3: str, caplog) -> None:
    get(node(tmp_path / "a", s3))
    stored = objects(s3)
    flip_a_byte(s3, max((n for n in stored if n.startswith("blobs/")), key=stored.__getitem__))  # the library
    second = node(tmp_path / "b", s3)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(second)
    assert (second.stats()["compiles"], second.stats()["s3_hits"]) == (1, 0)
    assert any("does not match its sha256" in r.getMessage() for r in caplog.records)
    third = node(tmp_path / "c", s3)
    get(third)
    assert (third.stats()["compiles"], third.stats()["s3_hits"]) == (0, 1)  # the blob was rewritten


@pytest.mark.parametrize("damage", [b"{not json", b'{"format": "kcache-s3-entry-1", "key": "other", "files": []}'])
def test_a_corrupt_manifest_is_detected_recompiled_and_replaced(tmp_path: Path, s3: str, caplog, damage: bytes) -> None:
    get(node(tmp_path / "a", s3))
    (manifest,) = entry_names(s3)
    obstore.put(open_bucket(s3), manifest, damage)
    second = node(tmp_path / "b", s3)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(second)
    assert (second.stats()["compiles"], second.stats()["s3_hits"]) == (1, 0)
    assert any("ignoring remote entry" in r.getMessage() for r in caplog.records)
    assert any("replaced the remote entry" in r.getMessage() for r in caplog.records)
    third = node(tmp_path / "c", s3)
    get(third)
    assert (third.stats()["compiles"], third.stats()["s3_hits"]) == (0, 1)


def test_a_manifest_copied_under_another_key_is_refused(tmp_path: Path, s3: str, caplog) -> None:
    signed = {"remote_secret": "s3cret"}
    get(node(tmp_path / "a", s3, **signed), "k0")
    get(node(tmp_path / "a", s3, **signed), "k1")
    first, second = entry_names(s3)
    store = open_bucket(s3)
    obstore.put(store, second, bytes(obstore.get(store, first).bytes()))  # a replay, no secret needed
    reader = node(tmp_path / "b", s3, **signed)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(reader, "k0")
        get(reader, "k1")
    assert reader.stats()["s3_hits"] == 1 and reader.stats()["compiles"] == 1
    assert any("signature does not verify" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("writer_secret,reader_secret", [("s3cret", "other"), (None, "s3cret")])
def test_entries_under_the_wrong_secret_are_refused(tmp_path: Path, s3: str, writer_secret, reader_secret) -> None:
    get(node(tmp_path / "a", s3, remote_secret=writer_secret))
    reader = node(tmp_path / "b", s3, remote_secret=reader_secret)
    get(reader)
    assert (reader.stats()["compiles"], reader.stats()["s3_hits"]) == (1, 0)
    matching = node(tmp_path / "c", s3, remote_secret=reader_secret)
    get(matching)  # the refusing reader replaced the manifest with one under its own secret
    assert (matching.stats()["compiles"], matching.stats()["s3_hits"]) == (0, 1)


def test_a_store_killed_mid_run_means_local_work_one_warning_no_hang(tmp_path: Path, monkeypatch, caplog) -> None:
    with s3_server() as own:
        for name, value in own.env.items():
            monkeypatch.setenv(name, value)
        cache = node(tmp_path / "a", own.url())
        get(cache, "k0")
        assert cache.stats()["uploads"] == 1
        os.kill(own.process.pid, signal.SIGKILL)
        own.process.wait()
        with caplog.at_level(logging.WARNING, logger="kcache"):
            get(cache, "k1")
            get(cache, "k2")
    assert cache.stats()["compiles"] == 3
    warnings = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(warnings) == 1 and own.url() in warnings[0]  # the circuit breaker kept the second call local


FAULTY = Path(__file__).with_name("faulty_endpoints.py")


def test_a_slow_store_costs_one_deadline_not_the_call(tmp_path: Path, server, monkeypatch, caplog) -> None:
    """A proxy that passes the store's answers on one byte per 0.3 s: each byte within the client's
    timeout, so only the deadline on the whole operation stops the wait."""
    proxy = subprocess.Popen([sys.executable, str(FAULTY), "trickle", "127.0.0.1", str(server.port), "0.3"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        port = int(proxy.stdout.readline())
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        cache = node(tmp_path / "a", server.url(f"slow-{uuid.uuid4().hex[:8]}"))
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kcache"):
            kernel = get(cache)
        took = time.monotonic() - started
    finally:
        proxy.kill()
        proxy.wait()
    assert kernel.name == "k0" and cache.stats()["compiles"] == 1
    assert took < 30, f"the call waited {took:.1f} s on a slow store"  # a deadline, not a speed goal
    assert any("is unavailable" in r.getMessage() for r in caplog.records)


def test_redis_then_s3_backfills_the_nearer_tier(tmp_path: Path, s3: str) -> None:
    import redis

    with redis_server(tmp_path) as (redis_url, _):
        both = f"{redis_url},{s3}"
        get(node(tmp_path / "a", both))
        client = redis.Redis.from_url(redis_url)
        client.flushall()  # Redis lost everything (a restart): S3 still has it
        second = node(tmp_path / "b", both)
        get(second)
        assert (second.stats()["compiles"], second.stats()["s3_hits"], second.stats()["redis_hits"]) == (0, 1, 0)
        assert [k for k in client.keys("kcache:*") if b"lease" not in k]  # backfilled into Redis
        third = node(tmp_path / "c", both)
        get(third)
        assert (third.stats()["compiles"], third.stats()["redis_hits"], third.stats()["s3_hits"]) == (0, 1, 0)


def test_a_lease_object_is_exclusive_released_and_taken_over_when_stale(s3: str, caplog) -> None:
    first = S3Tier(s3, "e1:tlease", frozenset({"x"}), secret="s")
    second = S3Tier(s3, "e1:tlease", frozenset({"x"}), secret="s")
    lease = first.try_lease("k", 30.0)
    assert lease and second.try_lease("k", 30.0) is False and second.lease_held("k", 30.0) is True
    lease.release()
    assert second.lease_held("k", 30.0) is False
    taken = second.try_lease("k", 30.0)  # a released lease is taken at once
    assert taken
    taken._stop.set()  # its holder "dies": no more renewals, and no release
    taken._thread.join()
    store = open_bucket(s3)
    stale = second._lease_body("k", "dead", 30.0)
    document = json.loads(stale)
    document.pop("mac")
    document["expires_ms"] = int((time.time() - 60) * 1000)  # expired a minute ago, signed properly
    from kcache.tiers.remote_guard import bound_mac
    from kcache.tiers.s3_bucket import canonical
    document["mac"] = bound_mac(b"s", second.lease_name("k"), canonical(document)).hex()
    obstore.put(store, second.lease_name("k"), canonical(document))
    with caplog.at_level(logging.WARNING, logger="kcache"):
        assert first.try_lease("k", 30.0)
    assert any("took over the compile lease" in r.getMessage() for r in caplog.records)


def test_doctor_checks_the_bucket_and_create_only_writes(tmp_path: Path, s3: str, monkeypatch) -> None:
    from kcache.cli.doctor import doctor

    def remote_findings(url: str):
        settings = dataclasses.replace(Settings.from_env(tmp_path), remote_url=url)
        return [f for f in doctor(settings) if f.check.startswith("remote")]

    (ok,) = remote_findings(s3)
    assert not ok.problem and "create-only" in ok.detail and "ms" in ok.detail
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    (dead,) = remote_findings(s3)
    assert dead.problem and "s3://" in dead.detail


def test_kcache_stats_shows_the_hits_of_every_tier(tmp_path: Path, server, s3: str) -> None:
    get(node(tmp_path / "a", s3))
    reader = spawn(f"""
import kcache
from stress.programs import synthetic
kcache.KernelCache({str(tmp_path / "b")!r}, backend=synthetic, remote={s3!r}).get_or_compile(
    synthetic.SyntheticFunc("k0"), "synthetic")
""", **server.env)
    assert reader.wait() == 0, reader.stderr.read()  # its counters are persisted at exit
    shown = subprocess.run([sys.executable, "-m", "kcache", "stats", "--dir", str(tmp_path / "b"), "--json"],
                           capture_output=True, text=True, check=True).stdout
    counters = json.loads(shown)
    assert (counters["s3_hits"], counters["redis_hits"], counters["remote_hits"]) == (1, 0, 1), shown


@pytest.mark.parametrize("value", ["s4://bucket", "s3://", "redis://h:1/0,,s3://b", "bucket/prefix"])
def test_a_bad_kcache_remote_fails_at_open_naming_the_entry(tmp_path: Path, monkeypatch, value: str) -> None:
    monkeypatch.setenv("KCACHE_REMOTE", value)
    with pytest.raises(ValueError, match="KCACHE_REMOTE=.*s3://BUCKET/PREFIX"):
        kcache.KernelCache(tmp_path / "root", backend=synthetic)
