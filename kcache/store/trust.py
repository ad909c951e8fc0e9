"""The trust check before kcache maps code (dlopen) or unpickles it, made on the descriptors then used.

Whoever can write an entry, or any directory above it up to the cache root,
can swap its files, manifest included, and so run code in every process that
loads it. An entry is trusted only if it and every directory up to the root
are directories (never symlinks) owned by the current user or root (or, in
group mode, by the cache's group, of which this process is a member), and
writable by nobody else: not by every user, and not by a group outside group
mode (except the user's own private group, which has no other member). Its
files must be regular files with the same owners and no such write bits.

Each directory is opened with O_NOFOLLOW relative to its parent's
descriptor and checked with fstat on that descriptor; the entry's files are
then opened relative to the checked directory and checked on their own
descriptors before a byte is read. A swap after the check changes nothing:
what was checked is what is read, and the library is loaded from a copy of
the bytes that were verified.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from kcache.errors import UntrustedEntry
from kcache.store import dirfd, sharing

# Where a checked file or directory is, for the message: a string, or a callable that makes it only
# when there is something to say (the hit path checks a dozen descriptors and says nothing).
Where = str | Callable[[], str]


def distrust(info: os.stat_result, where: Where, group: int | None, *, directory: bool) -> str:
    """Why the file or directory described by `info` is no safe place for code, or "" if it is."""
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    me = os.geteuid()
    owner_ok = info.st_uid == me or info.st_uid == 0 or (group is not None and info.st_gid == group)
    mode = info.st_mode
    if kind_ok and owner_ok and not mode & stat.S_IWOTH and not (mode & stat.S_IWGRP and info.st_gid != group
                                                                 and not _private_group(info.st_gid)):
        return ""
    named = where if isinstance(where, str) else where()
    if not kind_ok:
        return f"{named} is not a {'directory' if directory else 'regular file'} (a symlink, a device?)"
    if not owner_ok:
        also = f" nor the cache's group (gid {group})" if group is not None else ""
        return f"{named} is owned by uid {info.st_uid}, neither you (uid {me}) nor root{also}"
    if mode & stat.S_IWOTH:
        return f"{named} is writable by every user (mode {stat.filemode(mode)})"
    return (f"{named} is writable by group {info.st_gid} (mode {stat.filemode(mode)}) outside group "
            "mode: set KCACHE_UMASK to share a root through a group")


@functools.lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """The user's own primary group with no other member (user private groups, umask 002 distributions):
    its write bit lets nobody else in."""
    import grp  # here: only a group-writable file asks, and a hit loads neither module (0.1-0.2 ms)
    import pwd

    me = os.geteuid()
    try:
        if gid != pwd.getpwuid(me).pw_gid:
            return False
        members = set(grp.getgrgid(gid).gr_mem)
        return members <= {pwd.getpwuid(me).pw_name}
    except KeyError:
        return False


def open_trusted_dir(root: Path, relative: Path | Sequence[str]) -> int:
    """A descriptor of `root / relative`, every directory from the root down opened without following
    a link and checked on its descriptor. Raises FileNotFoundError (a miss) or UntrustedEntry."""
    names = relative.parts if isinstance(relative, Path) else tuple(relative)
    group = sharing.trusted_group(root)
    fd = dirfd.open_root(root)
    try:
        reason = distrust(os.fstat(fd), str(root), group, directory=True)
        for depth, name in enumerate(names, 1):
            if reason:
                break
            try:
                following = os.open(name, dirfd.DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in dirfd.NOT_A_DIRECTORY_ERRNOS:
                    reason = f"{root.joinpath(*names[:depth])} is not a directory (a symlink?)"
                    break
                raise
            os.close(fd)
            fd = following
            reason = distrust(os.fstat(fd), lambda depth=depth: str(root.joinpath(*names[:depth])), group,
                              directory=True)
    except BaseException:
        os.close(fd)
        raise
    if reason:
        os.close(fd)
        raise UntrustedEntry(str(root.joinpath(*names)), reason)
    return fd


def check_file(fd: int, where: Where, group: int | None) -> os.stat_result:
    """fstat of an opened entry file, raising UntrustedEntry unless it is trusted."""
    info = os.fstat(fd)
    reason = distrust(info, where, group, directory=False)
    if reason:
        raise UntrustedEntry(where if isinstance(where, str) else where(), reason)
    return info


def read_trusted(root: Path, relative: Path, name: str, limit: int) -> bytes:
    """A small file's bytes, the file and every directory from the root down trust-checked on the
    descriptors then read (a memo, say). Raises FileNotFoundError, UntrustedEntry or OSError."""
    dir_fd = open_trusted_dir(root, relative)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            info = check_file(fd, str(root / relative / name), sharing.trusted_group(root))
            if info.st_size > limit:
                raise OSError(errno.EFBIG, f"{name} is {info.st_size} bytes, more than {limit}")
            return os.pread(fd, info.st_size, 0)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def untrusted_reason(path: Path, root: Path) -> str:
    """Why `path` (inside `root`) is no safe place to load code from, or "" if it is (for reports:
    a loader uses open_trusted_dir and check_file, on the descriptors it then reads)."""
    try:
        fd = open_trusted_dir(root, Path(os.path.relpath(path, root)))
    except UntrustedEntry as untrusted:
        return untrusted.reason
    except OSError as err:
        return f"cannot open {path}: {err.strerror or err}"
    os.close(fd)
    return ""



