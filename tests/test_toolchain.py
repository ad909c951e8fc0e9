"""The toolchain fingerprint of a fresh root: hashed by one caller at a time, never waited on forever."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

from kcache.store import access, layout  # noqa: E402
from kcache.store.locks import KeyLock  # noqa: E402
from kcache.tilelang import fingerprint, toolchain  # noqa: E402

pytestmark = pytest.mark.tilelang
CALLERS = 4


@pytest.fixture
def counted_hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of the fingerprint's computation (the 105 MB hash and `nvcc --version`), by thread;
    and no fingerprint memoized in this process, as in a fresh one."""
    computed: list[int] = []
    real = toolchain._compute

    def counting(*args: object) -> dict[str, object]:
        computed.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(toolchain, "_compute", counting)
    monkeypatch.setattr(fingerprint, "_toolchain_memo", {})
    return computed


def identify_at_once(root: Path, callers: int) -> list[dict[str, object]]:
    """`callers` threads asking for the root's fingerprint at the same moment. Each takes the lock through
    a descriptor of its own, so they contend as processes do (flock is per open file description)."""
    barrier = threading.Barrier(callers)
    found: list[dict[str, object]] = []

    def one() -> None:
        barrier.wait()
        found.append(fingerprint.toolchain_fingerprint(root))
        fingerprint._toolchain_memo.clear()  # each caller its own process: none reuses another's memo

    threads = [threading.Thread(target=one) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(found) == callers
    return found


def test_callers_opening_one_fresh_root_at_once_hash_the_toolchain_once(tmp_path: Path,
                                                                         counted_hashes: list[int]) -> None:
    root = tmp_path / "root"
    access.create_root(root)
    found = identify_at_once(root, CALLERS)
    assert len(counted_hashes) == 1, f"{len(counted_hashes)} callers hashed the toolchain"
    assert all(f == found[0] for f in found) and found[0]["tilelang_libs"]
    assert len(list((root / layout.TOOLCHAIN).glob("*.json"))) == 1


def test_a_stuck_holder_of_the_toolchain_lock_is_waited_on_for_a_bounded_time(tmp_path: Path, counted_hashes: list[int],
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    access.create_root(root)
    signature = fingerprint.toolchain_signature()[0]
    monkeypatch.setattr(toolchain, "TOOLCHAIN_LOCK_WAIT_S", 0.3)
    with KeyLock(root / layout.LOCKS / f"toolchain-{signature}.lock", "holder") as held:
        assert held.acquire(1.0) == 0.0  # a holder that never writes the memo
        started = time.monotonic()
        found = fingerprint.toolchain_fingerprint(root)
        waited = time.monotonic() - started
    assert found["tilelang_libs"] and len(counted_hashes) == 1
    assert waited < 30.0, f"waited {waited:.1f} s on the holder, not the 0.3 s set"  # the default is 60 s


def test_a_read_only_root_identifies_the_toolchain_without_its_lock(tmp_path: Path, counted_hashes: list[int]) -> None:
    root = tmp_path / "root"
    access.create_root(root)
    found = fingerprint.toolchain_fingerprint(root, persist=False)
    assert found["tilelang_libs"] and len(counted_hashes) == 1
    assert not (root / layout.LOCKS).exists() and not (root / layout.TOOLCHAIN).exists()


def test_identifying_the_toolchain_of_a_root_removed_meanwhile_does_not_bring_it_back(
        tmp_path: Path, counted_hashes: list[int]) -> None:
    """A service worker identifies the toolchain for a process that opened its cache before `import
    tilelang`; by then a harness that only inspected that temporary root may have removed it."""
    root = tmp_path / "root"
    access.create_root(root)
    shutil.rmtree(root)
    found = fingerprint.toolchain_fingerprint(root)
    assert found["tilelang_libs"] and len(counted_hashes) == 1
    assert not root.exists()


@pytest.mark.parametrize("directory", [layout.TOOLCHAIN, layout.LOCKS])
def test_a_toolchain_directory_that_is_a_link_is_not_written_through(tmp_path: Path, counted_hashes: list[int],
                                                                     directory: str) -> None:
    """The memo (`<root>/.toolchain`) and its lock (`identify_once` takes it in `<root>/.locks`): a link
    planted in either place is refused (the fingerprint is computed without it), and nothing appears
    where it points."""
    root = tmp_path / "root"
    access.create_root(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / directory)
    found = fingerprint.toolchain_fingerprint(root)
    assert found["tilelang_libs"] and len(counted_hashes) == 1
    assert list(elsewhere.iterdir()) == [] and (root / directory).is_symlink()
