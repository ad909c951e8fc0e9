"""Naps that end when an entry arrives: a waiter's wake-up at the publish, not at its next poll.

A process that waits for another's compile of its key polls the key's lock and the entry (KeyLock's
backoff, 2 ms growing to 20 ms). Once the holder publishes, each waiter saw it only at its next
poll: the last of a herd's 31 waiters up to 20 ms after the publish, on every herd's critical path.
Here a waiter's nap also watches the entries directory (Linux inotify): the rename that publishes
the entry wakes it at once.

Only a hint: what wakes the waiter is checked as before (the entry loaded and verified through the
store, by descriptor). Where the watch cannot be had (not Linux, no inotify, a directory that is a
link or gone, a network filesystem where another node's rename raises no event) a nap is the plain
sleep it was, so the wait stays bounded by the lock's own timeout and backoff.
"""

from __future__ import annotations

import os
import select
import struct
import time
from pathlib import Path

_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name, NUL-padded
_READ_BYTES = 64 * 1024  # a read's bound: events are 16 bytes and a name


class Arrivals:
    """`nap(seconds)`: sleep until `name` appears in `directory`, or the seconds pass.

    Cheap to make: the watch is set up by the first nap, which returns at once so that its caller
    looks again (an arrival between the caller's last look and the watch raises no event)."""

    def __init__(self, directory: Path, name: str) -> None:
        self._directory = directory
        self._name = os.fsencode(name)
        self._fd: int | None = None
        self._watching: bool | None = None  # None: not tried yet; False: plain sleeps

    def nap(self, seconds: float) -> None:
        if self._watching is None:
            self._watching = self._watch()
            if self._watching:
                return
        if not self._watching or self._fd is None:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                readable, _, _ = select.select([self._fd], [], [], left)
                if not readable:
                    return
                if self._arrived(os.read(self._fd, _READ_BYTES)):
                    return
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # the watch broke: sleep out this nap, plain naps after it
                self.close()
                self._watching = False
                time.sleep(max(0.0, deadline - time.monotonic()))
                return

    def _watch(self) -> bool:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):  # not Linux, or no inotify in this libc
            return False
        if fd < 0:  # the user's instances are used up (fs.inotify.max_user_instances)
            return False
        mask = _IN_MOVED_TO | _IN_CREATE | _IN_ONLYDIR | _IN_DONT_FOLLOW
        if libc.inotify_add_watch(fd, os.fsencode(self._directory), mask) < 0:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _arrived(self, events: bytes) -> bool:
        """Whether `events` hold our name's arrival, or lost some (an overflow: look again)."""
        offset = 0
        while offset + _EVENT.size <= len(events):
            _wd, mask, _cookie, length = _EVENT.unpack_from(events, offset)
            name = events[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
            if mask & _IN_Q_OVERFLOW or name == self._name:
                return True
            offset += _EVENT.size + length
        return False

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Arrivals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
