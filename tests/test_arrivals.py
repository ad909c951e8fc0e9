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

    monkeypatch.setattr(ctypes, "CDLL", NoInotify)
    entries = tmp_path / "entries"
    entries.mkdir()
    with Arrivals(entries, KEY) as arrivals:
        publish(entries, KEY)
        started = time.monotonic()
        arrivals.nap(0.2)
        arrivals.nap(0.2)
        assert time.monotonic() - started >= 0.4
    assert len(calls) == 1  # the fault fired, once: no retry on every nap


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
        assert arrivals._fd is None


def test_an_overflowing_queue_wakes_the_nap(tmp_path: Path) -> None:
    """Events lost to an overflow may have held ours: the nap ends so that its caller looks."""
    arrivals = Arrivals(tmp_path, KEY)
    overflow = arrivals_module._EVENT.pack(-1, arrivals_module._IN_Q_OVERFLOW, 0, 0)
    other = arrivals_module._EVENT.pack(1, arrivals_module._IN_MOVED_TO, 0, 16) + b"other".ljust(16, b"\0")
    assert arrivals._arrived(other + overflow) and not arrivals._arrived(other)
    mine = arrivals_module._EVENT.pack(1, arrivals_module._IN_MOVED_TO, 0, 80) + os.fsencode(KEY).ljust(80, b"\0")
    assert arrivals._arrived(other + mine)
