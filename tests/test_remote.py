"""The Redis remote tier against a real redis-server: nodes share kernels, compile once, survive faults."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from pathlib import Path

import pytest

redis = pytest.importorskip("redis", reason="the remote tier needs redis-py (pip install -e '.[test]')")

import kcache  # noqa: E402
from kcache.config import Settings  # noqa: E402
from stress.programs import synthetic  # noqa: E402

from .helpers import cold_cluster, lease_holder  # noqa: E402
from .redis_server import redis_server  # noqa: E402


@pytest.fixture
def redis_url(tmp_path: Path):
    with redis_server(tmp_path) as (url, _server):
        yield url


def node(root: Path, url: str, **settings) -> kcache.KernelCache:
    chosen = dataclasses.replace(Settings.from_env(root), remote_url=url, **settings)
    return kcache.KernelCache(root, settings=chosen, backend=synthetic)


def get(cache: kcache.KernelCache, name: str = "k0"):
    return cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")


def test_a_second_node_gets_the_kernel_with_no_compile(tmp_path: Path, redis_url: str) -> None:
    first, second = node(tmp_path / "a", redis_url), node(tmp_path / "b", redis_url)
    made = get(first)
    assert first.stats()["compiles"] == 1 and first.stats()["uploads"] == 1
    fetched = get(second)
    assert second.stats()["compiles"] == 0 and second.stats()["remote_hits"] == 1
    assert fetched.library_sha == made.library_sha  # the same bytes on both nodes
    assert second.store.keys() == first.store.keys()  # published locally through the staging protocol


def test_sixteen_processes_on_four_roots_compile_each_key_once(tmp_path: Path, redis_url: str) -> None:
    names = ["k0", "k1", "k2"]
    # On failure: which process compiled what, and what it warned (a Redis deadline missed under load?).
    stats, said = cold_cluster(tmp_path, redis_url, names)
    assert sum(s["compiles"] for s in stats) == len(names), said
    assert sum(s["remote_hits"] for s in stats) == 3 * len(names), said  # each other root fetched each key once


def test_redis_killed_mid_run_means_local_work_one_warning_no_hang(tmp_path: Path, caplog) -> None:
    with redis_server(tmp_path) as (url, server):
        cache = node(tmp_path / "a", url)
        get(cache, "k0")
        assert cache.stats()["uploads"] == 1
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        with caplog.at_level(logging.WARNING, logger="kcache"):
            get(cache, "k1")
            get(cache, "k2")
    assert cache.stats()["compiles"] == 3
    warnings = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(warnings) == 1 and url in warnings[0]  # and the circuit breaker kept the second call local


def test_a_corrupt_remote_value_is_detected_recompiled_and_replaced(tmp_path: Path, redis_url: str, caplog) -> None:
    get(node(tmp_path / "a", redis_url))
    client = redis.Redis.from_url(redis_url)
    (key,) = [k for k in client.keys("kcache:*") if b"lease" not in k]
    value = client.get(key)
    client.set(key, value[:-10] + bytes([value[-10] ^ 0xFF]) + value[-9:])  # one flipped byte in a file
    second = node(tmp_path / "b", redis_url)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        get(second)
    assert second.stats()["compiles"] == 1 and second.stats()["remote_hits"] == 0
    assert any("ignoring remote entry" in r.getMessage() for r in caplog.records)
    third = node(tmp_path / "c", redis_url)
    get(third)
    assert (third.stats()["compiles"], third.stats()["remote_hits"]) == (0, 1)  # the value was replaced


@pytest.mark.parametrize("writer_secret,reader_secret", [("s3cret", "other"), (None, "s3cret"), ("s3cret", None)])
def test_entries_under_the_wrong_secret_are_refused(tmp_path: Path, redis_url: str, writer_secret, reader_secret) -> None:
    get(node(tmp_path / "a", redis_url, remote_secret=writer_secret))
    reader = node(tmp_path / "b", redis_url, remote_secret=reader_secret)
    get(reader)
    assert (reader.stats()["compiles"], reader.stats()["remote_hits"]) == (1, 0)
    matching = node(tmp_path / "c", redis_url, remote_secret=reader_secret)
    get(matching)  # the refusing reader replaced the value with one under its own secret
    assert (matching.stats()["compiles"], matching.stats()["remote_hits"]) == (0, 1)


def test_a_dead_lease_holder_frees_the_lease_and_another_node_compiles(tmp_path: Path, redis_url: str) -> None:
    holder = lease_holder(tmp_path / "a", redis_url, KCACHE_REMOTE_LEASE="1")  # it holds the cluster lease now
    client = redis.Redis.from_url(redis_url)
    assert [k for k in client.keys("kcache:*") if b"lease" in k]
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    waiter = node(tmp_path / "b", redis_url, remote_lease_s=1.0)
    get(waiter)  # waits for the lease to lapse (no renewals from the dead), then compiles
    assert waiter.stats()["compiles"] == 1


def test_a_live_lease_is_waited_for_at_most_KCACHE_LOCK_TIMEOUT_with_backoff_then_compiled_here(
        tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Another node holds the lease and keeps it alive (renewing it) without uploading: this node waits
    for it, politely (a widening pause, not a loop on Redis), for KCACHE_LOCK_TIMEOUT in all, then
    compiles the kernel itself, with one warning that says why."""
    import time

    holder = lease_holder(tmp_path / "a", redis_url)
    try:
        client = redis.Redis.from_url(redis_url)
        client.config_resetstat()
        waiter = node(tmp_path / "b", redis_url, lock_timeout_s=2.0)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kcache"):
            kernel = get(waiter)
        took = time.monotonic() - started
        calls = {name: int(v["calls"]) for name, v in client.info("commandstats").items()}
    finally:
        holder.kill()
        holder.wait()
    assert kernel.name == "k0" and waiter.stats()["compiles"] == 1
    assert 2.0 <= took < 2.0 + 3.0, took  # it waited for the live lease, and no longer than the setting
    # A lease try is one SET NX: a wait of T seconds makes about 6 + 2T of them (kcache.tiers.backoff),
    # plus the upload's; a loop on Redis made thousands. (The holder's renewals are EVALSHA.)
    assert calls["cmdstat_set"] <= 6 + 2 * 2 + 2 and sum(calls.values()) < 150, calls
    warned = [r.getMessage() for r in caplog.records if "compiling it here too" in r.getMessage()]
    assert len(warned) == 1 and "KCACHE_LOCK_TIMEOUT" in warned[0]


def test_doctor_checks_that_the_remote_answers(tmp_path: Path, redis_url: str) -> None:
    from kcache.cli.doctor import doctor

    def remote_finding(url: str):
        settings = dataclasses.replace(Settings.from_env(tmp_path), remote_url=url)
        return next(f for f in doctor(settings) if f.check == "remote")

    assert not remote_finding(redis_url).problem
    dead = remote_finding("redis://127.0.0.1:1/0")
    assert dead.problem and "unreachable" in dead.detail


FAULTY = Path(__file__).with_name("faulty_endpoints.py")


def start_endpoint(*args: str):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, str(FAULTY), *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_redis_that_trickles_its_answers_costs_one_deadline_not_the_call(
        tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each byte arrives well within the socket timeout (0.5 s), so only a deadline on the whole
    operation stops the wait; the kernel compiles locally and Redis is left alone for a while."""
    import time
    from urllib.parse import urlparse

    upstream = urlparse(redis_url)
    proxy, port = start_endpoint("trickle", upstream.hostname or "127.0.0.1", str(upstream.port), "0.3")
    try:
        cache = node(tmp_path / "a", f"redis://127.0.0.1:{port}/0")
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kcache"):
            kernel = get(cache)
        took = time.monotonic() - started
    finally:
        proxy.kill()
        proxy.wait()
    assert kernel.name == "k0" and cache.stats()["compiles"] == 1
    assert took < 30, f"the call waited {took:.1f} s on a trickling Redis"  # a deadline, not a speed goal
    assert any("no whole answer within" in r.getMessage() for r in caplog.records)


def test_an_endpoint_that_is_not_redis_is_a_remote_failure_not_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    endpoint, port = start_endpoint("ok")
    try:
        cache = node(tmp_path / "a", f"redis://127.0.0.1:{port}/0")
        with caplog.at_level(logging.WARNING, logger="kcache"):
            kernel = get(cache)
    finally:
        endpoint.kill()
        endpoint.wait()
    assert kernel.name == "k0" and cache.stats()["compiles"] == 1
    assert any("is unavailable" in r.getMessage() for r in caplog.records)
