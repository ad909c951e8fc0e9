"""Naps that end when an entry arrives: a waiter's wake-up at the publish, not at its next poll.

A process that waits for another's compile of its key polls the key's lock and the entry (KeyLock's
backoff, 2 ms growing to 20 ms). Once the holder publishes, each waiter saw it only at its next
poll: the last of a herd's 31 waiters up to 20 ms after the publish, on every herd's critical path.
Here a waiter's nap also watches the entries directory (Linux inotify): the rename that publishes
the entry wakes it at once.

One inotify instance per process, kept for its life: closing an instance waits for the kernel's
grace period (0.1-16 ms measured on the CPU machine, on the waiter's path right after its wake-up),
while adding and removing a watch on a live one takes microseconds. A directory's watch lives while
some wait of the process needs it. One napping thread at a time polls the instance, reads its events
and wakes the waits they name; the other napping threads wait to be woken by it, and one of them takes
over when it stops.

A forked child drops the inherited instance at the fork (`os.register_at_fork`) and makes its own
if it waits.

Only a hint: what wakes the waiter is checked as before (the entry loaded and verified through the
store, by descriptor). Where the watch cannot be had (not Linux, no inotify, a directory that is a
link or gone, a network filesystem where another node's rename raises no event) a nap is the plain
sleep it was, so the wait stays bounded by the lock's own timeout and backoff.
"""

from __future__ import annotations

import errno
import math
import os
import select
import struct
import threading
import time
from pathlib import Path

_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_WATCH_MASK = _IN_MOVED_TO | _IN_CREATE | _IN_ONLYDIR | _IN_DONT_FOLLOW
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name, NUL-padded
_READ_BYTES = 64 * 1024  # a read's bound: events are 16 bytes and a name
_INSTANCE_GONE = select.POLLERR | select.POLLHUP | select.POLLNVAL


class _Watcher:
    """This process's inotify instance: watches by directory, counted, and the waits on each name."""

    def __init__(self, libc: object, fd: int) -> None:
        self.libc = libc
        self.fd = fd
        self.lock = threading.Lock()
        self.watches: dict[bytes, tuple[int, int]] = {}  # directory -> (wd, waits using it)
        self.waits: dict[tuple[int, bytes], set[threading.Event]] = {}
        # One thread at a time polls the instance (the reader); the others wait on `changed`, which
        # the reader notifies once it has read (its events may be theirs) or stops reading (one of
        # them takes over). A wait blocked in poll would not see its event set by another thread
        # that read it first: it slept out its nap.
        self.changed = threading.Condition(self.lock)
        self.polling = False
        # poll, not select: select refuses a descriptor numbered 1024 or more (FD_SETSIZE), and a
        # process holding that many files (a data loader's, a server's) would nap blind.
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def add(self, directory: bytes, name: bytes, woken: threading.Event) -> int | None:
        with self.lock:
            wd, users = self.watches.get(directory, (-1, 0))
            if users == 0:
                wd = self.libc.inotify_add_watch(self.fd, directory, _WATCH_MASK)
                if wd < 0:
                    return None
            self.watches[directory] = (wd, users + 1)
            self.waits.setdefault((wd, name), set()).add(woken)
            return wd

    def remove(self, directory: bytes, wd: int, name: bytes, woken: threading.Event) -> None:
        with self.lock:
            waits = self.waits.get((wd, name), set())
            waits.discard(woken)
            if not waits:
                self.waits.pop((wd, name), None)
            _wd, users = self.watches.get(directory, (wd, 1))
            if users > 1:
                self.watches[directory] = (wd, users - 1)
                return
            self.watches.pop(directory, None)
            self.libc.inotify_rm_watch(self.fd, wd)  # microseconds; its IN_IGNORED event wakes nobody

    def wait(self, woken: threading.Event, deadline: float) -> bool:
        """Until `woken` is set or the monotonic `deadline` passes: as the reader, or woken by it.
        False where the instance failed (the caller sleeps out its nap instead)."""
        with self.changed:
            while not woken.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self.polling:
                    self.changed.wait(left)
                    continue
                self.polling = True
                try:
                    if self._poll_unlocked(left):
                        self._read()
                except OSError:
                    return False
                finally:
                    self.polling = False
                    self.changed.notify_all()
        return True

    def _poll_unlocked(self, seconds: float) -> bool:
        """Whether the instance holds events, waiting at most `seconds` with the lock let go."""
        self.lock.release()
        try:
            for _fd, happened in self.poller.poll(max(1, math.ceil(seconds * 1000))):
                if happened & _INSTANCE_GONE:  # poll reports it, again at once: not a wake-up to read
                    raise OSError(errno.EBADF, "the inotify instance is gone")
                return True
            return False
        finally:
            self.lock.acquire()

    def _read(self) -> None:
        """Under the lock: read what the instance holds (never blocking) and wake the waits it names."""
        try:
            events = os.read(self.fd, _READ_BYTES)
        except BlockingIOError:
            return
        offset = 0
        while offset + _EVENT.size <= len(events):
            wd, mask, _cookie, length = _EVENT.unpack_from(events, offset)
            name = events[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            woken = [event for waits in self.waits.values() for event in waits] if mask & _IN_Q_OVERFLOW \
                else self.waits.get((wd, name), ())
            for event in woken:  # an overflow lost events: every wait looks again
                event.set()


_watcher: _Watcher | None = None
_watcher_lock = threading.Lock()
_unavailable = False  # this process could not have an instance: plain naps, without asking again


def _process_watcher() -> _Watcher | None:
    """This process's instance, made on first use."""
    global _watcher, _unavailable
    with _watcher_lock:
        if _watcher is not None:
            return _watcher
        if _unavailable:
            return None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):  # not Linux, or no inotify in this libc
            fd = -1
        if fd < 0:  # or the user's instances are used up (fs.inotify.max_user_instances)
            _unavailable = True
            return None
        _watcher = _Watcher(libc, fd)
        return _watcher


def _forget_in_child() -> None:
    """After a fork, in the child: the instance is the parent's (its events are not the child's to
    read). Its descriptor is closed at once, before the child can open anything on its number; the
    parent holds the instance, so this close does not wait. Locks are made anew: a thread of the
    parent may have held one at the fork."""
    global _watcher, _watcher_lock, _unavailable
    inherited, _watcher = _watcher, None
    _watcher_lock = threading.Lock()
    _unavailable = False
    if inherited is not None:
        try:
            os.close(inherited.fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class Arrivals:
    """`nap(seconds)`: sleep until `name` appears in `directory`, or the seconds pass.

    Cheap to make: the watch is set up by the first nap, which returns at once so that its caller
    looks again (an arrival between the caller's last look and the watch raises no event)."""

    def __init__(self, directory: Path, name: str) -> None:
        self._directory = os.fsencode(directory)
        self._name = os.fsencode(name)
        self._woken = threading.Event()
        self._watcher: _Watcher | None = None
        self._wd = -1
        self._tried = False

    def nap(self, seconds: float) -> None:
        if not self._tried:
            self._tried = True
            watcher = _process_watcher()
            wd = watcher.add(self._directory, self._name, self._woken) if watcher is not None else None
            if watcher is not None and wd is not None:
                self._watcher, self._wd = watcher, wd
                return
        watcher = self._watcher
        if watcher is None:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        if not watcher.wait(self._woken, deadline):  # the instance is gone: sleep out this nap, plain naps after it
            self.close()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        self._woken.clear()

    def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.remove(self._directory, self._wd, self._name, self._woken)

    def __enter__(self) -> Arrivals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
