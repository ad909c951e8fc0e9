"""Security review, issue 36 (part A): what a writer of the remote store can plant under a lease's name,
against a real redis-server and a real S3-protocol server process (moto's, stress.servers.s3).

A lease is input from whoever can write to the store. Whatever is planted there (too big, another
Redis type, unparseable, an expiry too big for a float) is measured before it is read, judged
invalid, and taken over: it never stalls a compile or a tune claim, never costs a node its memory,
and never marks the tier down. And every wait on another node's lease is bounded (KCACHE_TUNE_WAIT,
KCACHE_LOCK_TIMEOUT) and backs off: the requests it makes are counted on the servers themselves
(the S3 server's request log, Redis's INFO).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import kcache
from kcache.config import Settings
from kcache.results.autotune import COMPONENTS, NAMESPACE, RESULT_FORMAT
from kcache.results.tune_once import RemoteResults, TuneOnce, TuneWaitTimeout
from kcache.store import layout
from kcache.store.entries import EntryStore
from kcache.tiers.remote_guard import MAX_LEASE_BYTES
from stress.programs import synthetic
from stress.servers import s3 as _s3_server

from .helpers import child_env
from .test_remote import redis_url  # noqa: F401 - a fixture: a real redis-server
from .test_tune_once import compiled_root, tune_scale, warm_root  # noqa: F401 - fixtures: kernels TileLang compiled

SECRET = "cluster-secret"

# ---------------------------------------------------------------- an S3 server that logs every request

# stress.servers.s3's server, with every request written to a log file before it is served: a request
# whose answer the client has seen is in the log, so counting needs no wait.
LOGGED_S3_SERVER = """
import sys
import werkzeug.serving
from stress.servers import s3 as s3_server

requests = open(sys.argv[1], "a", buffering=1)
plain_server = werkzeug.serving.make_server

def logging_server(host, port, app, **options):
    def logged(environ, start_response):
        requests.write(environ["REQUEST_METHOD"] + " " + environ.get("PATH_INFO", "") + "\\n")
        return app(environ, start_response)
    return plain_server(host, port, logged, **options)

werkzeug.serving.make_server = logging_server
s3_server.serve(0, s3_server.BUCKET)
"""


@dataclass
class LoggedS3:
    process: subprocess.Popen[str]
    port: int
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {**_s3_server.CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}"}

    def requests(self, method: str) -> int:
        return sum(line.startswith(method + " ") for line in self.log.read_text().splitlines())


@pytest.fixture(scope="module")
def logged_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedS3]:
    _s3_server.check_installed()  # moto's server is a test dependency: missing, this errors (no skip)
    log = tmp_path_factory.mktemp("s3-log") / "requests.log"
    process = subprocess.Popen([sys.executable, "-c", LOGGED_S3_SERVER, str(log)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=child_env())
    assert process.stdout is not None
    said = []
    for line in process.stdout:  # a handshake on its output, not a sleep
        if line.startswith("ready "):
            break
        said.append(line)
    else:
        raise RuntimeError(f"the S3 server exited with status {process.wait()}: {''.join(said)[-2000:]}")
    threading.Thread(target=process.stdout.read, daemon=True).start()  # a full pipe would block it
    try:
        yield LoggedS3(process, int(line.split()[1]), log)
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def s3(logged_s3: LoggedS3, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix of the logged server's bucket, with the client's environment set."""
    for name, value in logged_s3.env.items():
        monkeypatch.setenv(name, value)
    return f"s3://{_s3_server.BUCKET}/t-{uuid.uuid4().hex[:12]}"


def node(root: Path, url: str, **settings: Any) -> kcache.KernelCache:
    chosen = dataclasses.replace(Settings.from_env(root), remote_url=url, **settings)
    return kcache.KernelCache(root, settings=chosen, backend=synthetic)


def get(cache: kcache.KernelCache, name: str = "k0") -> Any:
    return cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")


def compiled_then_forgotten(root: Path, url: str, secret: str | None) -> tuple[str, Any]:
    """Compile k0 on a first node (learning its key and tier), then remove its remote entry: the next
    node must take the lease and compile."""
    first = node(root, url, remote_secret=secret)
    get(first)
    (key,) = first.store.keys()
    tier = first._remote(synthetic).tiers[0]  # noqa: SLF001
    return key, tier


# ---------------------------------------------------------------- S3: planted leases


PLANTED_S3_LEASES = {
    # Over MAX_LEASE_BYTES, with a secret set: once answered "held" by try_lease and "not held" by
    # lease_held, so a compile polled in a loop until KCACHE_LOCK_TIMEOUT.
    "oversized": (b"x" * (MAX_LEASE_BYTES + 1024), SECRET, "over the 4096 of a lease"),
    # JSON nested deeper than Python's recursion limit: once a RecursionError that marked S3 down.
    "deeply nested": (b"[" * 3000, SECRET, "not a kcache lease (RecursionError)"),
    # Without a secret nothing is signed: an infinite expiry was once an OverflowError (S3 down).
    "infinite expiry": (b'{"expires_ms":1e400,"format":"kcache-s3-lease-1"}', None, "not a kcache lease (OverflowError)"),
}


@pytest.mark.parametrize("planted", sorted(PLANTED_S3_LEASES))
def test_a_planted_s3_lease_is_taken_over_at_once_and_never_marks_the_bucket_down(
        tmp_path: Path, s3: str, logged_s3: LoggedS3, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    import obstore

    from kcache.tiers.s3_bucket import open_bucket

    body, secret, why = PLANTED_S3_LEASES[planted]
    key, tier = compiled_then_forgotten(tmp_path / "a", s3, secret)
    store = open_bucket(s3)
    obstore.delete(store, tier.entry_name(key))
    obstore.put(store, tier.lease_name(key), body)  # a bucket writer without the secret
    second = node(tmp_path / "b", s3, remote_secret=secret, lock_timeout_s=10.0)
    gets_before, started = logged_s3.requests("GET"), time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(second)
    took, gets = time.monotonic() - started, logged_s3.requests("GET") - gets_before
    assert (second.stats()["compiles"], second.stats()["uploads"]) == (1, 1), second.stats()
    assert took < 5.0 and gets < 20, f"{took:.1f} s and {gets} GETs to get past a planted lease"
    assert second._remote(synthetic).tiers[0].available()  # noqa: SLF001 - planted data is no outage
    messages = [r.getMessage() for r in caplog.records]
    assert any("took over the compile lease" in m and why in m for m in messages), messages
    assert not any("is unavailable" in m for m in messages), messages


def tune_claim(root: Path, url: str, identity: str, wait_s: float) -> TuneOnce[Any]:
    """The claim on tuning `identity`, as autotuner.tune makes it, for a result nobody has yet."""
    cache = node(root, url, remote_secret=SECRET)
    store = EntryStore(cache.root / NAMESPACE, "", COMPONENTS, check_name=layout.check_entry_name)
    tier = cache.remote_tier_for(f"a{RESULT_FORMAT}", store.required, synthetic)
    assert tier is not None
    return TuneOnce(cache.root, identity, "planted-tune", load=lambda: None, exists=lambda: False, wait_s=wait_s,
                    remote=RemoteResults(tier, store, identity[:40]))


def test_a_tune_claim_takes_over_an_oversized_s3_lease_and_a_contended_one_waits_KCACHE_TUNE_WAIT(
        tmp_path: Path, s3: str, logged_s3: LoggedS3) -> None:
    import obstore

    from kcache.tiers.s3_bucket import open_bucket

    identity = uuid.uuid4().hex * 2
    first = tune_claim(tmp_path / "a", s3, identity, wait_s=2.0)
    lease_name = first._remote.tier.tiers[0].lease_name(identity[:40])  # noqa: SLF001
    store = open_bucket(s3)
    obstore.put(store, lease_name, b"x" * (MAX_LEASE_BYTES + 1024))
    outcome: dict[str, Any] = {}
    gets_before, started = logged_s3.requests("GET"), time.monotonic()
    claiming = threading.Thread(target=lambda: outcome.update(found=first.claim()), daemon=True)
    claiming.start()
    claiming.join(timeout=15)
    took, gets = time.monotonic() - started, logged_s3.requests("GET") - gets_before
    if claiming.is_alive():
        obstore.delete(store, lease_name)  # ends the spin this test failed on, before it fails
        claiming.join()
    try:
        assert took < 5.0 and gets < 20, f"the claim took {took:.1f} s and {gets} GETs (KCACHE_TUNE_WAIT=2)"
        assert outcome == {"found": None} and first.held  # it took the planted lease over: it tunes

        # Another node, while the first tunes under a valid lease: it waits KCACHE_TUNE_WAIT, backing off.
        second = tune_claim(tmp_path / "b", s3, identity, wait_s=2.0)
        gets_before, started = logged_s3.requests("GET"), time.monotonic()
        with pytest.raises(TuneWaitTimeout, match="KCACHE_TUNE_WAIT"):
            second.claim()
        took, gets = time.monotonic() - started, logged_s3.requests("GET") - gets_before
        assert 2.0 <= took < 6.0, f"a wait of KCACHE_TUNE_WAIT=2 took {took:.1f} s"
        assert gets < 40, f"{gets} GETs in a wait of {took:.1f} s: no backoff"
    finally:
        first.release()


# ---------------------------------------------------------------- Redis: planted leases


PLANTED_REDIS_LEASES = {
    # 8 MiB where a lease is ~100 bytes: once downloaded whole by every waiter (and sent back in the
    # compare-and-delete: at 200 MB that overran the deadline and marked Redis down).
    "huge string": (lambda c, n: c.set(n, b"\0" * (8 << 20)), "over the 4096 of a lease"),
    # Other types: once a WRONGTYPE error on GET, which marked Redis down for 30 s.
    "hash": (lambda c, n: c.hset(n, "field", "planted"), "a Redis hash where a string value belongs"),
    "list": (lambda c, n: c.rpush(n, "planted"), "a Redis list where a string value belongs"),
    # Without a secret nothing is signed: an expiry too big for a float was once an OverflowError
    # out of get_or_compile.
    "expiry too big for a float": (lambda c, n: c.set(n, b"token." + b"9" * 400), "not a kcache lease"),
}


@pytest.mark.parametrize("planted", sorted(PLANTED_REDIS_LEASES))
def test_a_planted_redis_lease_is_measured_taken_over_and_never_marks_redis_down(
        tmp_path: Path, redis_url: str, planted: str, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    import redis

    plant, why = PLANTED_REDIS_LEASES[planted]
    key, tier = compiled_then_forgotten(tmp_path / "a", redis_url, None)
    client = redis.Redis.from_url(redis_url)
    client.delete(tier.prefix + key)
    lease = f"{tier.prefix}lease:{key}"
    plant(client, lease)
    client.config_resetstat()
    second = node(tmp_path / "b", redis_url, lock_timeout_s=10.0)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(second)
    stats = client.info("stats")
    commands = sum(int(v["calls"]) for v in client.info("commandstats").values())
    assert (second.stats()["compiles"], second.stats()["uploads"]) == (1, 1), second.stats()
    assert second._remote(synthetic).tiers[0].available()  # noqa: SLF001 - planted data is no outage
    # Measured in Redis, never sent: far less than the planted 8 MiB left the server, and nothing
    # that big went back in (the upload itself is ~55 KB).
    assert int(stats["total_net_output_bytes"]) < 64 << 10, stats["total_net_output_bytes"]
    assert int(stats["total_net_input_bytes"]) < 1 << 20, stats["total_net_input_bytes"]
    assert commands < 40, client.info("commandstats")  # one take-over, no polling loop
    messages = [r.getMessage() for r in caplog.records]
    assert any("took over the invalid compile lease" in m and why in m for m in messages), messages
    assert not any("is unavailable" in m for m in messages), messages
    assert client.exists(lease) == 0  # replaced by our lease, released after the compile


def test_a_tune_claim_takes_over_a_huge_redis_lease_and_a_contended_one_waits_KCACHE_TUNE_WAIT(
        tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    """As in S3: a planted lease (8 MiB) is taken over at once, never downloaded; a valid one is
    waited for KCACHE_TUNE_WAIT, backing off, then the claim raises TuneWaitTimeout."""
    import redis

    identity = uuid.uuid4().hex * 2
    first = tune_claim(tmp_path / "a", redis_url, identity, wait_s=2.0)
    tier = first._remote.tier.tiers[0]  # noqa: SLF001
    client = redis.Redis.from_url(redis_url)
    client.set(f"{tier.prefix}lease:{identity[:40]}", b"\0" * (8 << 20))
    client.config_resetstat()
    started = time.monotonic()
    assert first.claim() is None and first.held  # it took the planted lease over: it tunes
    took, sent = time.monotonic() - started, int(client.info("stats")["total_net_output_bytes"])
    try:
        assert took < 5.0 and sent < 64 << 10, f"{took:.1f} s and {sent} bytes to get past a planted lease"
        second = tune_claim(tmp_path / "b", redis_url, identity, wait_s=2.0)
        client.config_resetstat()
        started = time.monotonic()
        with pytest.raises(TuneWaitTimeout, match="KCACHE_TUNE_WAIT"):
            second.claim()
        took = time.monotonic() - started
        tries = int(client.info("commandstats").get("cmdstat_set", {}).get("calls", 0))
        assert 2.0 <= took < 6.0, f"a wait of KCACHE_TUNE_WAIT=2 took {took:.1f} s"
        assert tries <= 6 + 2 * 2 + 1, f"{tries} lease tries in a wait of {took:.1f} s: no backoff"
    finally:
        first.release()


# ---------------------------------------------------------------- a forced re-tune replaces the remote result


@pytest.mark.tilelang
def test_a_forced_retune_replaces_the_result_in_s3(tmp_path: Path, warm_root: Path, s3: str,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`kcache untune`'s help says: in a cluster, use tune(force=True), which replaces the remote result
    too. Once, S3 kept the first pick (its create-only publish left a verifying manifest alone)."""
    monkeypatch.setenv("KCACHE_REMOTE", s3)
    monkeypatch.setenv("KCACHE_REMOTE_SECRET", SECRET)
    calls: list[int] = []
    assert tune_scale(warm_root, 128, calls).config == {"block": 128}  # published to the bucket
    assert tune_scale(warm_root, 256, calls, force=True).config == {"block": 256}
    assert len(calls) == 6
    fresh = tune_scale(tmp_path / "node-b", 512, calls)  # a node with nothing: the bucket's result
    assert fresh.config == {"block": 256} and len(calls) == 6
