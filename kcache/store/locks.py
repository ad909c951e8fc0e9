"""Per-key inter-process locks (flock) for single-flight compiles.

As in filelock: `_try_acquire` makes exactly one non-blocking attempt, and
`acquire` owns the timeout, the polling backoff and the logging. The kernel
drops a flock when its holder dies, SIGKILL included, so a dead compiler
never wedges its waiters.

Lock files are removed only by `remove_idle_lock_files`, which unlinks a
file while holding its lock; an acquirer that then finds its descriptor no
longer matches the path's inode retries, so two processes can never hold
"the same" lock through two different inodes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from kcache.errors import CacheLockTimeout
from kcache.store import held_locks, sharing
from kcache.store.dirfd import DIR_FLAGS, NOT_A_DIRECTORY_ERRNOS
from kcache.store.fsutil import ensure_dir

log = logging.getLogger("kcache")

# flock's answers for "another descriptor holds it" (Linux says EWOULDBLOCK; EACCES on some systems).
LOCK_HELD_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
# Opening a lock file (or its directory) found a symlink, a directory or another non-file there.
NOT_A_LOCK_FILE_ERRNOS = NOT_A_DIRECTORY_ERRNOS | {errno.EISDIR}


def try_flock(fd: int) -> bool:
    """One non-blocking attempt at an exclusive flock on `fd`: True if taken, False if held elsewhere.

    fcntl directly: portalocker imports redis-py where it is installed, ~100 ms of a fresh
    process's first cache open, for the one call it would make here.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in LOCK_HELD_ERRNOS:
            return False
        raise
    return True

# `take_file_lock`'s attempts whose file its holder removed between the open and the flock: one such
# race is rare; several in a row are answered as "held".
MAX_RELOCK_ATTEMPTS = 8


def take_file_lock(path: str | os.PathLike[str], create: bool = True) -> int | None:
    """A descriptor holding the flock of the file at `path` (created 0600 where absent and `create`),
    or None while another descriptor holds it. Its holder may remove the file (`unlink_held`): a flock
    taken on a file no longer at `path` is dropped and the path's new file tried, so that two
    processes never hold "one" lock through two inodes. FileNotFoundError where not `create`."""
    for _ in range(MAX_RELOCK_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if not try_flock(fd):
                os.close(fd)
                return None
            if _same_file(fd, Path(path)):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if not create and not os.path.lexists(path):
            raise FileNotFoundError(errno.ENOENT, "removed by its holder", str(path))
    return None


def unlink_held(fd: int, path: str | os.PathLike[str]) -> None:
    """Remove the lock file at `path` whose flock `fd` holds, before `fd` is closed (a taker that
    opened it meanwhile then finds it gone, and takes the path's new file)."""
    if _same_file(fd, Path(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def remove_free_lock_file(path: str | os.PathLike[str]) -> bool:
    """Remove the lock file at `path` if nobody holds it; whether it did."""
    try:
        fd = take_file_lock(path, create=False)
    except FileNotFoundError:
        return False
    if fd is None:
        return False
    try:
        unlink_held(fd, path)
        return True
    finally:
        os.close(fd)


# A holder may say who it is and how far it got (`KeyLock.write_note`): a tune's waiters show it.
MAX_NOTE_BYTES = 4096
_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.02


class KeyLock:
    """An exclusive lock on `<root>/.locks/<key>.lock`. Not reentrant."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = Path(path)
        self.key = key
        self._fd: int | None = None
        self._noted = False  # this hold wrote a note, which its release truncates

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float, give_up_when: Callable[[], bool] | None = None,
                nap: Callable[[float], None] = time.sleep) -> float | None:
        """Block until the lock is ours; return the seconds spent waiting (0.0 if free).

        Between attempts, `give_up_when()` may end the wait early (the holder's
        result became visible, say): then None is returned and nothing is held.
        `nap(seconds)` waits between attempts; it may return early (kcache/store/arrivals.py wakes
        at the holder's publish), never late. Raises CacheLockTimeout after `timeout` seconds.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this KeyLock")
        ensure_dir(self.path.parent)
        start = time.monotonic()
        poll = _FIRST_POLL_S
        logged = False
        while True:
            fd = self._try_acquire()
            if fd is not None:
                self._fd = fd
                held_locks.holding(self)  # a fork of this process lets go of its copy (held_locks)
                return time.monotonic() - start if logged else 0.0
            if give_up_when is not None and give_up_when():
                return None
            waited = time.monotonic() - start
            if waited >= timeout:
                raise CacheLockTimeout(str(self.path), timeout, self.key)
            if not logged:
                log.debug("kcache: waiting for %s (another process is compiling %s)", self.path, self.key[:16])
                logged = True
            nap(min(poll, max(timeout - waited, 0.0)))
            poll = min(poll * 1.5, _MAX_POLL_S)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            held_locks.letting_go(self)
            if self._noted:  # only a noting holder pays for this: a kernel's lock releases as before
                self._noted = False
                try:
                    os.ftruncate(fd, 0)  # a note is the holder's: it ends with the hold
                except OSError:
                    pass  # a note left behind is only stale text, shown until the next holder writes its own
            # Closing the descriptor drops the flock.
            os.close(fd)

    def forget_in_child(self) -> None:
        """In a fork's child: close this process's copy of the parent's hold, which the child never held
        and cannot release (kcache.store.held_locks); the parent's hold is unchanged."""
        fd, self._fd, self._noted = self._fd, None, False
        if fd is not None:
            os.close(fd)

    def write_note(self, note: bytes) -> None:
        """While held: replace the lock file's content with `note` (who holds it, how far it got),
        for waiters to show (`read_note`). Best effort: a note that cannot be written is not an error."""
        if self._fd is None:
            raise RuntimeError(f"{self.path} is not held by this KeyLock")
        self._noted = True
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, note[:MAX_NOTE_BYTES], 0)
        except OSError as err:
            log.debug("kcache: cannot write the note of %s: %s", self.path, err)

    def __enter__(self) -> KeyLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _try_acquire(self) -> int | None:
        fd = _open_in_locks_dir(self.path, os.O_RDWR | os.O_CREAT)
        try:
            _share(fd)
            taken = try_flock(fd)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            return None
        if not _same_file(fd, self.path):
            # gc unlinked the file between our open and our lock: try again on
            # the path's current file.
            os.close(fd)
            return None
        return fd


def _share(fd: int) -> None:
    """In group mode, a lock file this process created must be writable by every member (they
    open it O_RDWR to lock it); the process's umask may have taken that away."""
    exact = sharing.file_mode(sharing.SHARED_FILE_MODE)
    if exact is None:
        return
    info = os.fstat(fd)
    if info.st_uid == os.geteuid() and info.st_mode & 0o777 != exact:
        os.fchmod(fd, exact)


def _same_file(fd: int, path: Path) -> bool:
    return _same_file_at(fd, None, str(path))


def _same_file_at(fd: int, dir_fd: int | None, name: str) -> bool:
    try:
        on_disk = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def read_note(path: Path) -> bytes:
    """The note of the lock file at `path` (empty if none); a link there is not followed."""
    try:
        fd = _open_in_locks_dir(Path(path), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.pread(fd, MAX_NOTE_BYTES, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def remove_idle_lock_files(locks_dir: Path) -> int:
    """Unlink every lock file that nobody holds (empty, or a dead holder's note); return how many."""
    removed = 0
    try:
        dir_fd = os.open(locks_dir, DIR_FLAGS)  # a `.locks` that is a symlink is refused, never followed
    except FileNotFoundError:
        return 0
    except OSError as err:
        if err.errno not in NOT_A_DIRECTORY_ERRNOS:
            raise
        log.warning("kcache: not sweeping %s: it is not a directory of kcache's (a symlink?). Remove it if it "
                    "is yours.", locks_dir)
        return 0
    try:
        for name in os.listdir(dir_fd):
            if name.endswith(".lock"):
                removed += _remove_if_idle(dir_fd, name)
    finally:
        os.close(dir_fd)
    return removed


def _open_in_locks_dir(path: Path, flags: int) -> int:
    """Open a lock file through its directory's descriptor: neither is followed if it is a link."""
    dir_fd = os.open(path.parent, DIR_FLAGS)
    try:
        return os.open(path.name, flags | os.O_CLOEXEC | os.O_NOFOLLOW, sharing.SHARED_FILE_MODE, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _remove_if_idle(dir_fd: int, name: str) -> int:
    """Unlink lock file `name` if nobody holds it and it holds at most a note: 1 if it was, else 0."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0
    except OSError as err:
        if err.errno in NOT_A_LOCK_FILE_ERRNOS:  # a link or a directory planted there: not ours to remove
            return 0
        raise
    try:
        taken = try_flock(fd)
    except OSError:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return 0
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_NOTE_BYTES and _same_file_at(fd, dir_fd, name):
            os.unlink(name, dir_fd=dir_fd)
            return 1
    finally:
        os.close(fd)
    return 0
