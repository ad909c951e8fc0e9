"""Small filesystem primitives with explicit durability and errno handling."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

from kcache.store import sharing

log = logging.getLogger("kcache")

# rename(2) of a directory onto an existing non-empty directory: another
# writer published the same key first. Every other errno is a real failure.
RENAME_RACE_ERRNOS = frozenset({errno.EEXIST, errno.ENOTEMPTY})

# Directory fsync is not supported everywhere (some FUSE and network
# filesystems); these mean "cannot", not "failed".
FSYNC_UNSUPPORTED_ERRNOS = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF})


def write_durable(path: Path, data: bytes, mode: int = sharing.WRITE_ONCE_FILE_MODE) -> None:
    """Create `path` exclusively, write all of `data` and fsync it.

    Such a file is never written again, only replaced by rename, so it is read-only by default.
    """
    exact = sharing.file_mode(mode)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        sharing.fix_mode(fd, exact)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
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
