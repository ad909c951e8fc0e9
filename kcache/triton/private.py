"""What a process keeps to itself for Triton: a compile's files until they are published, and the
copies of lone files that Triton loads. Loaded on a miss or a lone file only: a group's hit needs none.

A compile's files go into a private directory (PrivateDirectory), made by descriptor under the write
root's `triton/.staging` (gc removes it once its process is gone) or in the temporary directory, and
read back through that descriptor when the group is published.

Lone files: the paths kcache hands Triton are private copies of bytes kcache checked.

Triton `dlopen`s its driver's and its launchers' shared objects (and reads its autotuner's timings)
from the path its cache manager's `get_file` or `put` returns, after the manager returned it. A path
into the cache would be read again, later, through directories that others may share, and after a
lost race it would name another writer's entry. So a lone file is handed over as a copy, written
here from the bytes that were verified (a hit: trust from the root down, size and sha256) or that
Triton just built (`put`), into a directory of this process's own: made with an unpredictable name
(0700) on a filesystem that allows exec (KCACHE_EXEC_DIR, else the runtime directory, the temporary
directory, /dev/shm: kcache.store.exec_copy's candidates), removed when the process exits. A
`noexec` cache root needs nothing more: its shared objects are never loaded in place.

One directory per entry: Triton gives every kernel's launcher the same file name. A copy is written
once per process and entry; `dlopen` keys what it loaded by path, and each path names one entry's bytes.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from kcache.errors import NoExecError
from kcache.store import dirfd, layout
from kcache.store.exec_copy import exec_dir_candidates, noexec_mount
from kcache.triton.roots import NAMESPACE, TritonRoots

MAX_FILE_BYTES = 1 << 30
_directory: Path | None = None
_lock = threading.Lock()
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_lock=threading.Lock()))
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def private_copy(entry: str, name: str, data: bytes) -> str:
    """The path of a private copy of `data`, the file `name` of the entry `entry` (its hex key)."""
    with _lock:
        directory = _private_directory(name) / entry
        copy = directory / name
        if copy.exists():  # this process wrote it: Triton asks for a launcher again
            return str(copy)
        directory.mkdir(mode=0o700, exist_ok=True)
        partial = directory / f".{name}.partial"
        _write_all(os.open(partial, _FLAGS, 0o500), data)
        os.replace(partial, copy)
    return str(copy)


def _write_all(fd: int, data: bytes) -> None:
    """`data` into the new file `fd`, which is then closed."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _private_directory(name: str) -> Path:
    """This process's directory of copies, made at its first lone file (the caller holds _lock)."""
    global _directory
    if _directory is None:
        for base in exec_dir_candidates():
            if noexec_mount(base) is None:
                _directory = Path(tempfile.mkdtemp(prefix="kcache-triton-", dir=base))
                atexit.register(shutil.rmtree, _directory, True)
                break
        else:
            raise NoExecError(f"Triton's {name}", None, "no directory that allows exec to copy it to (set "
                              "KCACHE_EXEC_DIR to one)")
    return _directory


class PrivateDirectory:
    """A directory of this process's own (0700) for the files of a group being compiled, held open:
    its files are made through that descriptor, never through a link planted on the way to it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def write(self, name: str, data: bytes) -> Path:
        _write_all(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600,
                           dir_fd=self.fd), data)
        return self.path / name

    def read(self, name: str) -> bytes:
        """`name`'s bytes, through the directory's descriptor: what this process wrote there."""
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_FILE_BYTES:
                raise OSError(f"{self.path / name} is {size} bytes, more than {MAX_FILE_BYTES}")
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)

    def remove(self) -> None:
        os.close(self.fd)
        shutil.rmtree(self.path, ignore_errors=True)


def private_directory(where: TritonRoots) -> PrivateDirectory:
    """A private directory for a manager's files: a staging name under the write root's triton/.staging,
    made by descriptor from the root (gc removes it once this process is gone), else a temp directory."""
    if where.write is not None:
        from kcache.store.fsutil import make_dirs_at  # a miss's: a hit makes no private directory

        name = str(layout.StagingName.fresh("0" * 16))
        try:
            root_fd = dirfd.open_root(where.write)
            try:
                staging_fd = make_dirs_at(root_fd, NAMESPACE, layout.STAGING)  # as the store makes it
            finally:
                os.close(root_fd)
            try:
                os.mkdir(name, 0o700, dir_fd=staging_fd)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=staging_fd)
            finally:
                os.close(staging_fd)
            return PrivateDirectory(where.write / NAMESPACE / layout.STAGING / name, fd)
        except OSError:
            pass
    path = Path(tempfile.mkdtemp(prefix="kcache-triton-"))
    return PrivateDirectory(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
