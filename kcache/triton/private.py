"""What a process keeps to itself for Triton: a compile's files until they are published, and the
copies of lone files that Triton loads. Loaded on a miss or a lone file only: a group's hit needs none.

A compile's files go into a private directory (PrivateDirectory), made by descriptor under the write
root's `triton/.staging` (gc removes it once its process is gone) or in the temporary directory, and
read back through that descriptor when the group is published.

Lone files: the paths kcache hands Triton are private copies of bytes kcache checked, written afresh
for each load, in memory.

Triton `dlopen`s its driver's and its launchers' shared objects (and reads its autotuner's timings)
from the path its cache manager's `get_file` or `put` returns, after the manager returned it. A path
into the cache, or into any directory another user can write (a group's KCACHE_EXEC_DIR without the
sticky bit), would be resolved again then, and could name another user's file by that time. So each
load gets a copy of its own: an anonymous memory file (`memfd_create`), written from the bytes just
verified (a hit: trust from the root down, size and sha256) or just built (`put`), then sealed against
any change; nothing is reused by path. Its path is `/proc/self/fd/<D>/<n>-<name>`: D is this process's
descriptor of a directory of its own (0700, made once in the user's private runtime directory, checked
on that descriptor), so the path resolves through no directory by name, and a rename of that directory
or of any parent changes nothing; `<n>-<name>` in it is a symbolic link to `/proc/self/fd/<memfd>`
(Triton's module loader picks the loader by the name's `.so` ending, which a memfd's own path lacks).
The memory file is not subject to a `noexec` mount: a hardened machine whose /tmp, /dev/shm and
runtime directory forbid exec needs nothing set. Where the kernel refuses executable memory files
(`vm.memfd_noexec`), the copy is a file (0500) in that directory, which must then allow exec
(KCACHE_EXEC_DIR names another directory for it). The copies go when the process exits.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import shutil
import tempfile
import threading
from collections import deque
from pathlib import Path

from kcache.errors import NoExecError
from kcache.store import dirfd, layout
from kcache.store.exec_copy import exec_dir_candidates
from kcache.triton.roots import NAMESPACE, TritonRoots

MAX_FILE_BYTES = 1 << 30
# Memory files still open: a load resolves its link at once, after which the mapping (or the text
# read) holds what it needs; the oldest are closed past this many, so that a process loading thousands
# of launchers (Inductor's) keeps a bounded number of descriptors.
OPEN_COPIES = 64
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_MFD_EXEC = getattr(os, "MFD_EXEC", 0x0010)  # Linux 6.3+; older kernels refuse the flag (EINVAL)


class _Copies:
    """This process's directory of copies, held by descriptor, and the memory files behind its links."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.fd = -1
        self.count = 0
        self.open_memfds: deque[tuple[int, str]] = deque()  # (memory file, the link to it)
        self.memory_refused = False  # the kernel refused executable memory files: plain files from now on


_copies = _Copies()
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_lock = threading.Lock()
# A thread of the parent may hold it at a fork (Helion's precompile children fork from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_lock=threading.Lock()))


def private_copy(entry: str, name: str, data: bytes) -> str:
    """The path of a fresh private copy of `data`, the file `name` of the entry `entry` (its hex key)."""
    with _lock:
        directory_fd = _directory_fd(name)
        _copies.count += 1
        link = f"{_copies.count}-{entry[:16]}-{name}"
        if not _copies.memory_refused:
            try:
                memfd = _sealed_memory_file(name, data)
            except OSError:
                _copies.memory_refused = True
            else:
                os.symlink(f"/proc/self/fd/{memfd}", link, dir_fd=directory_fd)
                _keep_open(memfd, link, directory_fd)
                return f"/proc/self/fd/{directory_fd}/{link}"
        _write_all(os.open(link, _FLAGS, 0o500, dir_fd=directory_fd), data)
        return f"/proc/self/fd/{directory_fd}/{link}"


def _sealed_memory_file(name: str, data: bytes) -> int:
    """A memory file holding `data`, sealed: nothing can change it after this returns."""
    try:
        fd = os.memfd_create(f"kcache-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | _MFD_EXEC)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        fd = os.memfd_create(f"kcache-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        if os.fstat(fd).st_size != len(data):
            raise OSError(f"the memory copy of {name} holds {os.fstat(fd).st_size} bytes, not {len(data)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _keep_open(memfd: int, link: str, directory_fd: int) -> None:
    """Past OPEN_COPIES, the oldest memory file is closed and its link removed with it: a link left to a
    closed descriptor would name whatever file took that number next."""
    _copies.open_memfds.append((memfd, link))
    while len(_copies.open_memfds) > OPEN_COPIES:
        oldest, its_link = _copies.open_memfds.popleft()
        os.unlink(its_link, dir_fd=directory_fd)
        os.close(oldest)


def _write_all(fd: int, data: bytes) -> None:
    """`data` into the new file `fd`, which is then closed."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _directory_fd(name: str) -> int:
    """The descriptor of this process's directory of copies, made at its first lone file in the user's
    private runtime directory (else the first of the exec candidates that is ours), checked on the
    descriptor: a directory of this user's, open to nobody else. The caller holds _lock."""
    if _copies.fd >= 0:
        return _copies.fd
    refusals = []
    for base in _bases():
        try:
            path = Path(tempfile.mkdtemp(prefix="kcache-triton-", dir=base))
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            refusals.append(f"{base}: {err.strerror or err}")
            continue
        status = os.fstat(fd)
        if status.st_uid != os.geteuid() or status.st_mode & 0o077:
            os.close(fd)
            refusals.append(f"{path}: not this user's own directory")
            continue
        _copies.directory, _copies.fd = path, fd
        atexit.register(shutil.rmtree, path, True)
        return fd
    raise NoExecError(f"Triton's {name}", None, "no private directory to hold its copy ("
                      + "; ".join(refusals) + "): set XDG_RUNTIME_DIR or KCACHE_EXEC_DIR to a directory of yours")


def _bases() -> list[Path]:
    """Where the directory of copies may be made: the user's private runtime directory (no exec needed
    there: the copies are memory files), then KCACHE_EXEC_DIR and the others that exec_copy names."""
    from kcache.compile.runtime_dir import runtime_directory

    bases: list[Path] = []
    try:
        bases.append(runtime_directory())
    except OSError:  # NoServiceDirectory: none of the user's own
        pass
    return bases + [base for base in exec_dir_candidates() if base not in bases]


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
