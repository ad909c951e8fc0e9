"""Per-key locks across processes: exclusion, SIGKILLed holders, timeouts, gc of lock files."""

from __future__ import annotations

import os
import select
import signal
import threading
from pathlib import Path

import pytest

from kcache.errors import CacheLockTimeout
from kcache.store.locks import KeyLock, read_note, remove_idle_lock_files

from .helpers import expect_line, spawn

KEY = "ef" * 32


def hold_lock_in_child(path: Path):
    child = spawn(f"""
        import sys
        from kcache.store.locks import KeyLock
        lock = KeyLock({str(path)!r}, {KEY!r})
        lock.acquire(timeout=30)
        print("locked", flush=True)
        sys.stdin.readline()
    """)
    expect_line(child, "locked")
    return child


def test_a_held_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / ".locks" / f"{KEY}.lock"
    child = hold_lock_in_child(path)
    try:
        with pytest.raises(CacheLockTimeout) as caught:
            KeyLock(path, KEY).acquire(timeout=0.2)
        assert caught.value.lock_file == str(path)
        assert isinstance(caught.value, TimeoutError)
        assert "KCACHE_LOCK_TIMEOUT" in str(caught.value)
    finally:
        child.kill()
        child.wait()


def test_sigkilled_holder_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / ".locks" / f"{KEY}.lock"
    child = hold_lock_in_child(path)
    waiter = KeyLock(path, KEY)
    result: dict[str, float] = {}
    thread = threading.Thread(target=lambda: result.setdefault("waited", waiter.acquire(timeout=30)))
    thread.start()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    thread.join(timeout=30)
    assert waiter.is_locked
    waiter.release()


def test_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / f"{KEY}.lock"
    first = KeyLock(path, KEY)
    assert first.acquire(timeout=1) == 0.0
    with pytest.raises(CacheLockTimeout):
        KeyLock(path, KEY).acquire(timeout=0.05)
    first.release()
    second = KeyLock(path, KEY)
    assert second.acquire(timeout=1) == 0.0
    second.release()


def test_gc_removes_idle_lock_files_but_never_a_held_one(tmp_path: Path) -> None:
    locks = tmp_path / ".locks"
    idle, held = KeyLock(locks / f"{'aa' * 32}.lock", "aa" * 32), KeyLock(locks / f"{KEY}.lock", KEY)
    idle.acquire(timeout=1)
    idle.release()
    held.acquire(timeout=1)
    try:
        assert remove_idle_lock_files(locks) == 1
        assert sorted(os.listdir(locks)) == [f"{KEY}.lock"]
    finally:
        held.release()


def test_an_acquirer_whose_file_was_unlinked_by_gc_retries_on_the_new_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The window between open() and flock() cannot be hit reliably from
    # outside, so gc runs inside it; check that it really ran.
    from kcache.store import locks

    path = tmp_path / f"{KEY}.lock"
    real_lock = locks.try_flock
    ran_gc: list[int] = []
    inside_gc = []

    def lock_after_gc(fd):
        if not ran_gc and not inside_gc:
            inside_gc.append(True)
            monkeypatch.setattr(locks, "try_flock", real_lock)  # gc itself locks normally
            ran_gc.append(remove_idle_lock_files(tmp_path))
        return real_lock(fd)

    monkeypatch.setattr(locks, "try_flock", lock_after_gc)
    lock = KeyLock(path, KEY)
    lock.acquire(timeout=5)
    try:
        assert ran_gc == [1]  # gc removed the file our first descriptor pointed to
        assert os.fstat(lock._fd).st_ino == os.stat(path).st_ino
    finally:
        lock.release()


def test_a_waiter_gives_up_when_the_holders_result_appears(tmp_path: Path) -> None:
    path = tmp_path / ".locks" / f"{KEY}.lock"
    result = tmp_path / "entry"
    child = hold_lock_in_child(path)
    try:
        checks = []

        def published() -> bool:
            checks.append(True)
            if len(checks) == 3:
                result.mkdir()  # the holder "publishes" while we wait
            return result.is_dir()

        waiter = KeyLock(path, KEY)
        assert waiter.acquire(timeout=30, give_up_when=published) is None
        assert not waiter.is_locked and len(checks) == 3
    finally:
        child.kill()
        child.wait()


def test_a_holders_note_is_read_by_others_ends_with_the_hold_and_a_dead_holders_is_swept(tmp_path: Path) -> None:
    path = tmp_path / ".locks" / f"{KEY}.lock"
    child = spawn(f"""
        import sys
        from kcache.store.locks import KeyLock
        lock = KeyLock({str(path)!r}, {KEY!r})
        lock.acquire(timeout=30)
        lock.write_note(b"pid and progress")
        print("noted", flush=True)
        sys.stdin.readline()
        lock.release()
        print("released", flush=True)
        sys.stdin.readline()
        lock.acquire(timeout=30)
        lock.write_note(b"dies holding this")
        print("noted again", flush=True)
        sys.stdin.readline()
    """)
    expect_line(child, "noted")
    assert read_note(path) == b"pid and progress"
    assert remove_idle_lock_files(path.parent) == 0  # held: kept, note and all
    child.stdin.write("\n")
    child.stdin.flush()
    expect_line(child, "released")
    assert read_note(path) == b""
    child.stdin.write("\n")
    child.stdin.flush()
    expect_line(child, "noted again")
    child.kill()
    child.wait()
    assert read_note(path) == b"dies holding this"
    assert remove_idle_lock_files(path.parent) == 1 and not path.exists()


def test_a_note_through_a_planted_link_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not for lock readers")
    (tmp_path / ".locks").mkdir()
    (tmp_path / ".locks" / "tune-x.lock").symlink_to(secret)
    assert read_note(tmp_path / ".locks" / "tune-x.lock") == b""


def test_a_lock_file_removed_by_its_holder_is_never_held_through_two_files(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """take_file_lock and unlink_held (the compile service's runtime files): a taker whose file its
    holder removed between the taker's open and its flock drops that flock and takes the path's new
    file, so the lock still has one holder."""
    from kcache.store import locks

    path = tmp_path / "compile-x.lock"
    holder = locks.take_file_lock(path)
    assert holder is not None and locks.take_file_lock(path) is None  # held: one holder
    real_flock, removed = locks.try_flock, []

    def flock_after_the_holder_removed_it(fd: int) -> bool:
        if not removed:  # the holder removes the file and exits between this taker's open and flock
            os.link(path, tmp_path / "kept")  # keeps the removed file's inode from being reused
            locks.unlink_held(holder, path)
            os.close(holder)
            removed.append(os.fstat(fd).st_ino)
        return real_flock(fd)

    monkeypatch.setattr(locks, "try_flock", flock_after_the_holder_removed_it)
    taker = locks.take_file_lock(path)
    monkeypatch.setattr(locks, "try_flock", real_flock)
    assert removed and taker is not None  # the fault fired, and the taker holds a lock
    assert removed[0] == (tmp_path / "kept").stat().st_ino  # the taker had opened the file its holder removed
    assert os.fstat(taker).st_ino == path.stat().st_ino != removed[0]  # it holds the path's new file instead
    assert locks.take_file_lock(path) is None
    assert not locks.remove_free_lock_file(path) and path.exists()  # held: it stays
    os.close(taker)
    assert locks.remove_free_lock_file(path) and not path.exists()  # free: removed
    assert not locks.remove_free_lock_file(path)  # nothing there: nothing created
    assert not path.exists()


def test_a_fork_made_while_a_lock_is_held_keeps_nothing_once_the_holder_lets_go(tmp_path: Path) -> None:
    """A child forked while this process holds a key's lock (a data loader's worker forked beside a
    compile) lives on; the holder releases; another acquirer takes the lock at once, where the child's
    copy of the descriptor would otherwise keep it locked for the child's life (kcache.store.held_locks)."""
    path = tmp_path / ".locks" / f"{KEY}.lock"
    lock = KeyLock(path, KEY)
    lock.acquire(timeout=5)
    reader, writer = os.pipe()
    ready_reader, ready_writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its fork handlers have run): says so, lives until the test lets it go
        os.close(writer)
        os.write(ready_writer, b"r")
        os.read(reader, 1)
        os._exit(0)
    os.close(reader)
    os.close(ready_writer)
    try:
        assert select.select([ready_reader], [], [], 60)[0] and os.read(ready_reader, 1) == b"r"
        lock.release()
        other = KeyLock(path, KEY)
        assert other.acquire(timeout=2) == 0.0  # the child still lives: without held_locks, CacheLockTimeout
        other.release()
    finally:
        os.write(writer, b"x")
        os.close(writer)
        os.close(ready_reader)
        os.waitpid(pid, 0)
