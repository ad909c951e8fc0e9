"""A waiter's nap ends when the entry it waits for is published into the entries directory
(kcache/store/arrivals.py), never later than asked, and is a plain sleep where no watch can be had."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from kcache.store import arrivals as arrivals_module
from kcache.store.arrivals import Arrivals
from kcache.store.locks import KeyLock

KEY = "ab" * 32


def publish(entries: Path, name: str) -> None:
    """As the store publishes: a staging directory renamed into place."""
    staging = entries.parent / f"staging-{name}"
    staging.mkdir()
    staging.rename(entries / name)


def test_a_nap_ends_when_its_entry_is_renamed_into_place_and_not_for_another(tmp_path: Path) -> None:
    entries = tmp_path / "entries"
    entries.mkdir()
    with Arrivals(entries, KEY) as arrivals:
        started = time.monotonic()
        arrivals.nap(30.0)  # the first nap sets the watch up and returns at once: its caller looks again
        assert time.monotonic() - started < 5.0
        publish(entries, "cd" * 32)  # another key's entry: the nap runs its whole length
        started = time.monotonic()
        arrivals.nap(0.3)
        assert time.monotonic() - started >= 0.3
        publish(entries, KEY)  # before the nap: the event waits in the watch's queue
        started = time.monotonic()
        arrivals.nap(30.0)
        assert time.monotonic() - started < 5.0


def test_a_nap_wakes_where_the_instance_has_a_descriptor_above_1023(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A process holding over a thousand files (a data loader's, a server's): its inotify instance
    gets a descriptor select() refuses (FD_SETSIZE). The nap still wakes at the publish."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files is {hard}: no descriptor above 1023 to be had")
    monkeypatch.setattr(arrivals_module, "_watcher", None)
    monkeypatch.setattr(arrivals_module, "_unavailable", False)
    entries = tmp_path / "entries"
    entries.mkdir()
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = os.open(os.devnull, os.O_RDONLY)
    held = [filler]
    try:
        while held[-1] < 1100:  # every lower number taken: the instance's is above them
            held.append(os.dup(filler))
        with Arrivals(entries, KEY) as arrivals:
            arrivals.nap(30.0)  # sets the watch up
            assert arrivals_module._watcher is not None and arrivals_module._watcher.fd > 1023
            publish(entries, KEY)
            started = time.monotonic()
            arrivals.nap(30.0)
            assert time.monotonic() - started < 5.0, "the nap slept instead of waking at the publish"
    finally:
        for fd in held:
            os.close(fd)
        if arrivals_module._watcher is not None:
            os.close(arrivals_module._watcher.fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_waiter_on_the_lock_leaves_at_the_publish(tmp_path: Path) -> None:
    """KeyLock.acquire with the arrivals' nap, its lock held by another thread's open file, which
    never lets go: the waiter ends on the publish, holding nothing."""
    entries = tmp_path / "entries"
    entries.mkdir()
    holder = KeyLock(tmp_path / ".locks" / f"{KEY}.lock", KEY)
    holder.acquire(1.0)
    naps: list[float] = []
    results: list[float | None] = []
    with Arrivals(entries, KEY) as arrivals:
        def nap(seconds: float) -> None:
            naps.append(seconds)
            if len(naps) == 3:
                publish(entries, KEY)  # while the waiter waits: its next nap sees it
            arrivals.nap(seconds)

        waiter = threading.Thread(target=lambda: results.append(
            KeyLock(holder.path, KEY).acquire(60.0, (entries / KEY).is_dir, nap)))
        waiter.start()
        waiter.join(60.0)
    holder.release()
    assert results == [None] and 3 <= len(naps) <= 4


def test_without_inotify_a_nap_is_a_plain_sleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: inotify_init1 fails (the user's instances used up). Every nap sleeps its length."""
    import ctypes

    calls: list[int] = []

    class NoInotify:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def inotify_init1(self, flags: int) -> int:
            calls.append(flags)
            return -1

    monkeypatch.setattr(arrivals_module, "_watcher", None)  # this process's instance, as if never made
    monkeypatch.setattr(arrivals_module, "_unavailable", False)
    monkeypatch.setattr(ctypes, "CDLL", NoInotify)
    entries = tmp_path / "entries"
    entries.mkdir()
    publish(entries, KEY)
    for _ in range(2):
        with Arrivals(entries, KEY) as arrivals:
            started = time.monotonic()
            arrivals.nap(0.2)
            arrivals.nap(0.2)
            assert time.monotonic() - started >= 0.4
    assert len(calls) == 1  # the fault fired, once in the process: no retry on every wait


def test_a_forked_child_waits_on_an_instance_of_its_own_and_takes_no_event_of_its_parent(tmp_path: Path) -> None:
    """One inotify instance per process (closing one waits for the kernel): a fork's child must not
    read its parent's, whose events would then be lost to the parent."""
    entries = tmp_path / "entries"
    entries.mkdir()
    with Arrivals(entries, KEY) as parents:
        parents.nap(0.0)  # the parent's watch is set up
        inherited = arrivals_module._watcher
        assert inherited is not None
        pid = os.fork()
        if pid == 0:  # the child: a wait of its own on another name, which it publishes itself
            code = 1
            try:
                fresh = arrivals_module._watcher is None
                with Arrivals(entries, "cd" * 32) as childs:
                    childs.nap(0.0)
                    publish(entries, "cd" * 32)
                    started = time.monotonic()
                    childs.nap(30.0)
                    woke = time.monotonic() - started < 5.0
                own = arrivals_module._watcher is not None and arrivals_module._watcher is not inherited
                code = 0 if fresh and woke and own else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        publish(entries, KEY)  # the parent's event is still the parent's
        started = time.monotonic()
        parents.nap(30.0)
        assert time.monotonic() - started < 5.0


def test_waits_of_many_threads_each_wake_at_their_own_whoever_reads_the_events(tmp_path: Path) -> None:
    """One instance, eight waits, twenty rounds: events read by any thread wake the waits they name,
    and a thread whose event another read is woken too, never left to sleep out its nap (in CI a
    thread that was about to poll when another read its event slept 30 s)."""
    for round_ in range(20):
        entries = tmp_path / f"entries-{round_}"
        entries.mkdir()
        names = [f"{index:02d}" * 32 for index in range(8)]
        woke: dict[str, float] = {}
        ready = threading.Barrier(len(names) + 1)

        def wait(name: str, entries: Path = entries, woke: dict[str, float] = woke,
                 ready: threading.Barrier = ready) -> None:
            with Arrivals(entries, name) as arrivals:
                arrivals.nap(0.0)
                ready.wait(30)
                started = time.monotonic()
                while not (entries / name).exists():
                    arrivals.nap(30.0)
                woke[name] = time.monotonic() - started

        threads = [threading.Thread(target=wait, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        ready.wait(30)
        for name in names:
            publish(entries, name)
        for thread in threads:
            thread.join(60)
        assert set(woke) == set(names) and all(seconds < 5.0 for seconds in woke.values()), (round_, woke)


def test_a_linked_entries_directory_is_not_watched(tmp_path: Path) -> None:
    """The watch follows no link: through a symlink to the entries, a nap only sleeps."""
    entries = tmp_path / "entries"
    entries.mkdir()
    link = tmp_path / "link"
    link.symlink_to(entries)
    with Arrivals(link, KEY) as arrivals:
        publish(entries, KEY)
        started = time.monotonic()
        arrivals.nap(0.3)
        assert time.monotonic() - started >= 0.3
        assert arrivals._watcher is None


def test_an_overflowing_queue_wakes_every_wait(tmp_path: Path) -> None:
    """Events lost to an overflow may have held any wait's: each wait is woken, to look again."""
    entries = tmp_path / "entries"
    entries.mkdir()
    with Arrivals(entries, KEY) as arrivals:
        arrivals.nap(0.0)
        watcher = arrivals_module._watcher
        assert watcher is not None
        read, write = os.pipe()
        real_fd, watcher.fd = watcher.fd, read
        try:
            os.write(write, arrivals_module._EVENT.pack(-1, arrivals_module._IN_Q_OVERFLOW, 0, 0))
            started = time.monotonic()
            arrivals.nap(30.0)
            assert time.monotonic() - started < 5.0
        finally:
            watcher.fd = real_fd
            os.close(read)
            os.close(write)
