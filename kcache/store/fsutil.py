"""Small filesystem primitives with explicit durability and errno handling."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from kcache.store import sharing

log = logging.getLogger("kcache")

# rename(2) of a directory onto an existing non-empty directory: another
# writer published the same key first. Every other errno is a real failure.
RENAME_RACE_ERRNOS = frozenset({errno.EEXIST, errno.ENOTEMPTY})

# Directory fsync is not supported everywhere (some FUSE and network
# filesystems); these mean "cannot", not "failed".
FSYNC_UNSUPPORTED_ERRNOS = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF})

# syncfs(2) missing from the kernel: fall back to an fsync per file.
SYNCFS_UNSUPPORTED_ERRNOS = frozenset({errno.ENOSYS})


def write_durable(path: Path, data: bytes, mode: int = sharing.WRITE_ONCE_FILE_MODE) -> None:
    """Create `path` exclusively, write all of `data` and fsync it.

    Such a file is never written again, only replaced by rename, so it is read-only by default.
    """
    write_durable_at(None, path, data, mode)


def write_durable_at(dir_fd: int | None, name: str | Path, data: bytes,
                     mode: int = sharing.WRITE_ONCE_FILE_MODE) -> None:
    """write_durable relative to a directory descriptor (None: `name` is a path)."""
    write_new_at(dir_fd, name, data, mode, durable=True)


def write_new_at(dir_fd: int | None, name: str | Path, data: bytes, mode: int = sharing.WRITE_ONCE_FILE_MODE,
                 *, durable: bool) -> None:
    """Create `name` exclusively (never through a link) with the sharing mode and write all of `data`;
    fsync it when `durable`. Not durable: for a batch that one `sync_filesystem` makes durable; its
    write-back is started at once (`start_writeback`), so that the disk works while the batch stages
    the rest and the final sync finds little left to do."""
    exact = sharing.file_mode(mode)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        sharing.fix_mode(fd, exact)
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
        else:
            start_writeback(fd)
    finally:
        os.close(fd)


SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing the dirty pages back, do not wait


@functools.cache
def _libc_function(name: str) -> Any:
    """libc's function `name` (errno kept), or None where this libc has none; looked up once."""
    import ctypes  # here: a batch needs it, a cache hit does not

    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # not Linux, or a libc without it
        return None


def start_writeback(fd: int) -> None:
    """sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE): ask the kernel to start writing the file's
    dirty pages now (a machine with much memory would otherwise keep them dirty until the batch's
    sync, and the disk would sit idle meanwhile). Best effort: no durability is promised by it, and
    a failure or a libc without it changes nothing but the timing."""
    import ctypes

    function = _libc_function("sync_file_range")
    if function is not None:
        function(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), ctypes.c_uint(SYNC_FILE_RANGE_WRITE))


def sync_filesystem(fd: int) -> bool:
    """syncfs(2): write back and wait for everything dirty on the filesystem that holds `fd` (its
    journal committed, the disk's cache flushed), in one call rather than an fsync per file. False
    where this libc or kernel has no syncfs: the caller then fsyncs what it wrote, file by file.
    Raises OSError when the write-back failed (Linux reports it since 5.8)."""
    import ctypes

    syncfs = _libc_function("syncfs")
    if syncfs is None:
        return False
    if syncfs(fd) == 0:
        return True
    code = ctypes.get_errno()
    if code in SYNCFS_UNSUPPORTED_ERRNOS:
        return False
    raise OSError(code, f"syncfs: {os.strerror(code)}")


def fsync_tree_at(dir_fd: int, name: str) -> None:
    """fsync every file of directory `name` in `dir_fd`, then the directory itself, by descriptor and
    never through a link: what `sync_filesystem` does for a staged entry where there is no syncfs."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            child_fd = os.open(child, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            try:
                os.fsync(child_fd)
            finally:
                os.close(child_fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (after a create or rename inside it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in FSYNC_UNSUPPORTED_ERRNOS:
            raise
    finally:
        os.close(fd)


def read_nofollow(path: Path) -> bytes:
    """Read a whole regular file, refusing symlinks."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def remove_tree(path: Path, why: str) -> bool:
    """Remove a directory tree that belongs to us (our staging, a quarantined entry).

    A removal failure must not hide the error that led here, so it is
    logged, not raised. Returns whether the tree is gone.
    """
    def on_exc(func, failed_path, err):  # noqa: ANN001 - shutil's callback signature
        if not isinstance(err, FileNotFoundError):
            log.warning("kcache: could not remove %s while %s: %s", failed_path, why, err)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=on_exc)
    else:
        shutil.rmtree(path, onerror=lambda func, failed, info: on_exc(func, failed, info[1]))
    return not os.path.lexists(path)


def ensure_dir(path: Path, mode: int = 0o755) -> Path:
    """Create `path` and missing parents; in group mode each new one gets the group's exact mode."""
    exact = sharing.dir_mode()
    if exact is None:
        os.makedirs(path, mode=mode, exist_ok=True)
        return path
    missing = []
    current = Path(path)
    while not current.is_dir():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        make_dir(directory, exist_ok=True)
    return path


def make_dir(path: Path, mode: int = 0o755, *, exist_ok: bool = False) -> None:
    """mkdir, with the group's exact mode in group mode (setgid, so the root's group is inherited)."""
    exact = sharing.dir_mode()
    try:
        os.mkdir(path, mode if exact is None else exact)
    except FileExistsError:
        if not exist_ok:
            raise
        return
    sharing.fix_mode(path, exact)


def make_dir_at(dir_fd: int, name: str, mode: int = 0o755) -> None:
    """make_dir relative to a directory descriptor (raises FileExistsError if `name` exists)."""
    exact = sharing.dir_mode()
    os.mkdir(name, mode if exact is None else exact, dir_fd=dir_fd)
    if exact is not None:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            sharing.fix_mode(fd, exact)
        finally:
            os.close(fd)


def make_dirs_at(dir_fd: int, *names: str) -> int:
    """A descriptor of the directory `names` below `dir_fd`, each created if missing (make_dir_at) and
    opened with O_NOFOLLOW relative to the last: a link planted for one is refused (ELOOP/ENOTDIR),
    never followed. An empty `names` is a duplicate of `dir_fd`."""
    current = os.dup(dir_fd)
    for name in names:
        try:
            with contextlib.suppress(FileExistsError):
                make_dir_at(current, name)
            following = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
        finally:
            os.close(current)
        current = following
    return current


def create_temporary_at(dir_fd: int, prefix: str, mode: int = 0o600) -> tuple[int, str]:
    """A new file with a random name in `dir_fd`: (its descriptor, open for writing, and its name).

    The one way kcache makes a temporary file: O_EXCL and O_NOFOLLOW, so a name planted in advance
    (a symlink to someone's file, say) is never opened, let alone written through.
    """
    for _ in range(100):
        name = f"{prefix}.{os.urandom(8).hex()}.tmp"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        return fd, name
    raise FileExistsError(errno.EEXIST, f"no free temporary name for {prefix}", prefix)


def replace_file_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace `name` in `dir_fd` with `data` atomically: a temporary file (create_temporary_at),
    written, fsynced when `durable`, renamed over it. Readers see the old or the new file, never a
    part. `durable=False` is for bookkeeping that a power cut may lose (a process's counters): the
    fsync cost ~1 ms of every fresh process's first disk hit."""
    exact = sharing.file_mode(mode)
    fd, temporary = create_temporary_at(dir_fd, name, mode)
    try:
        try:
            sharing.fix_mode(fd, exact if exact is not None else mode)
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def empty_staging(directory: Path) -> None:
    """Remove what an earlier, interrupted run of the same compile job left in its staging directory
    (the compile service died mid-job and the job runs again in the process's own pool): files only,
    by descriptor, never through a link."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in os.listdir(fd):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
