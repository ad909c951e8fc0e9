"""Loading a kernel library from a copy, where the cache's own filesystem forbids mapping code.

A cache root on a `noexec` mount (a shared /tmp, some container volumes)
holds perfectly good entries that `dlopen` refuses to map in place. kcache
then loads the already verified bytes from an anonymous memory file
(`memfd_create`), else from a private directory on a filesystem that allows
exec, and says so once. Nothing is deleted or quarantined: the entry is
fine, the machine is what forbids it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kcache.errors import NoExecError

Loaded = TypeVar("Loaded")

EXEC_DIR_ENV = "KCACHE_EXEC_DIR"
# dlopen's words when the kernel refuses to map a library's code (noexec, or a security module).
_MAPPING_REFUSED = re.compile(r"failed to map segment|operation not permitted", re.IGNORECASE)
# The library is fine, but something it links is missing here (a container without the CUDA driver).
_DEPENDENCY_MISSING = re.compile(r"cannot open shared object file", re.IGNORECASE)
# Linux 6.3+: ask for an executable memfd explicitly; older kernels do not know the flag (EINVAL).
_MFD_EXEC = getattr(os, "MFD_EXEC", 0x0010)


def is_mapping_refused(err: BaseException) -> bool:
    return _MAPPING_REFUSED.search(str(err)) is not None


def is_dependency_missing(err: BaseException) -> bool:
    return _DEPENDENCY_MISSING.search(str(err)) is not None


def noexec_mount(path: Path) -> Path | None:
    """The mount point of `path` if its filesystem is mounted noexec, else None."""
    try:
        if not os.statvfs(path).f_flag & os.ST_NOEXEC:
            return None
    except OSError:
        return None
    return mount_point(path)


def mount_point(path: Path) -> Path:
    current = Path(path).resolve()
    device = os.stat(current).st_dev
    while current.parent != current and os.stat(current.parent).st_dev == device:
        current = current.parent
    return current


def exec_dir_candidates() -> list[Path]:
    """Where a private copy may go: KCACHE_EXEC_DIR alone when it is set (the user chose), else the
    runtime dir, the temp dir and /dev/shm."""
    chosen = os.environ.get(EXEC_DIR_ENV)
    found = []
    for raw in (chosen,) if chosen else (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/dev/shm"):
        if not raw:
            continue
        path = Path(raw)
        if path.is_dir() and path not in found and os.access(path, os.W_OK | os.X_OK):
            found.append(path)
    return found


def load_copy(data: bytes, library: Path, mount: Path | None, *, load_fd_path: Callable[[str], Loaded],
              load_path: Callable[[str], Loaded]) -> Loaded:
    """Load `data` (the verified bytes of `library`) from a memfd, else from a private exec-allowed
    directory. `load_fd_path(path)` loads a /proc/self/fd path (no file name extension);
    `load_path(path)` a `<name>.so` path. Raises NoExecError when neither is allowed."""
    refusals: list[str] = []
    try:
        return _from_memfd(data, library.name, load_fd_path)
    except OSError as err:
        refusals.append(f"memfd: {err.strerror or err}")
    except Exception as err:  # the loader's own error type; only a refused mapping means "try elsewhere"
        if not is_mapping_refused(err):
            raise
        refusals.append(f"memfd: {err}")
    for directory in exec_dir_candidates():
        if noexec_mount(directory) is not None:
            refusals.append(f"{directory}: mounted noexec")
            continue
        try:
            return _from_private_dir(data, library.name, directory, load_path)
        except OSError as err:
            refusals.append(f"{directory}: {err.strerror or err}")
        except Exception as err:
            if not is_mapping_refused(err):
                raise
            refusals.append(f"{directory}: {err}")
    raise NoExecError(str(library), str(mount) if mount else None, "; ".join(refusals) or "no place to copy it to")


# Descriptors of the memfds loaded so far, kept open for the life of the process: glibc's dlopen
# recognizes an already loaded library by the name it was opened under, so a closed and reused
# /proc/self/fd/N would hand the next kernel the previous kernel's library. One descriptor per
# kernel loaded this way; loaded libraries are never unloaded anyway.
_loaded_memfds: list[int] = []
_loaded_memfds_lock = threading.Lock()


def _from_memfd(data: bytes, name: str, load: Callable[[str], Loaded]) -> Loaded:
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | _MFD_EXEC)
    except OSError as err:
        if err.errno != errno.EINVAL:  # a kernel older than MFD_EXEC; anything else is a refusal
            raise
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        _write_all(fd, data)
        loaded = load(f"/proc/self/fd/{fd}")
    except BaseException:
        os.close(fd)
        raise
    with _loaded_memfds_lock:
        _loaded_memfds.append(fd)
    return loaded


def _from_private_dir(data: bytes, name: str, base: Path, load: Callable[[str], Loaded]) -> Loaded:
    directory = Path(tempfile.mkdtemp(prefix="kcache-exec-", dir=base))  # 0700: nobody else can swap it
    path = directory / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o500)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return load(str(path))  # the mapping outlives the file
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
