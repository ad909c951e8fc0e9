"""Files kcache writes or reads on the user's behalf outside a root (the key record of
KCACHE_RECORD, a key list given to `--keys`): opened once, never through a link, checked on the
descriptor that is then used, and created with the privacy of the user's roots.

A record file often sits in a shared directory (a job's scratch space, /tmp). There, a link planted
at its name would make kcache append to whatever file the link names, and a file another user made
first would leak every key and take their injected records. So a record is appended only to a
regular file of this user with one link, never readable or writable by others beyond what the
roots' sharing allows (a private 0600, or group read and write in group mode: KCACHE_UMASK).
"""

from __future__ import annotations

import os
import stat

from kcache.store import sharing

MAX_KEY_FILE_BYTES = 64 << 20  # a key list: 64 MiB is some 200,000 records with their fields


class UnsafeFile(OSError):
    """A file kcache will not use: its message names the path, what is wrong, and the fix."""


def private_file_mode() -> int:
    """The mode of a file with the user's keys or kernels: 0600, or read and write for the group
    (less KCACHE_UMASK) when the cache is shared by a group."""
    if not sharing.group_mode():
        return 0o600
    return 0o660 & ~(sharing.configured_umask() or 0)


def open_for_append(path: str | os.PathLike[str]) -> int:
    """A descriptor appending to `path`, created private if missing (`_shared_mode`: the group's
    bits only for the cache's group). Raises UnsafeFile for a link, a non-regular file, another
    user's file or one with other links; a file of this user's open to more than its mode allows
    is narrowed to it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            created = True
        except FileExistsError:
            fd = os.open(path, flags)
            created = False
    except OSError:
        if os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link: kcache never writes through one; remove it or choose "
                             "another file") from None
        raise
    try:
        info = os.fstat(fd)
        _check_owned(path, info)
        allowed = _shared_mode(fd, path, info, claim_group=created)
        if created:
            os.fchmod(fd, allowed)  # exactly: the process's umask may have taken the group's bits
        elif stat.S_IMODE(info.st_mode) & ~allowed:  # ours: narrowing it is safe, and stops the leak
            os.fchmod(fd, stat.S_IMODE(info.st_mode) & allowed)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _shared_mode(fd: int, path: str | os.PathLike[str], info: os.stat_result, *, claim_group: bool) -> int:
    """The mode a record file may have: `private_file_mode()` where the file's group is the cache's
    (KCACHE_GROUP, which a file just created is given; without it, the group of a setgid directory,
    which the file took from it), else 0600: the user's primary group, or a directory's group that
    nobody chose for sharing, may be far broader than the cache's."""
    mode = private_file_mode()
    if mode == 0o600:
        return mode
    group = sharing.configured_group()
    if group is not None:
        if info.st_gid != group and claim_group:
            try:
                os.fchown(fd, -1, group)
            except PermissionError:
                return 0o600  # not a member of it: the file stays private
            return mode
        return mode if info.st_gid == group else 0o600
    directory = os.stat(os.path.dirname(os.path.abspath(path)))
    shared_directory = bool(directory.st_mode & stat.S_ISGID) and directory.st_gid == info.st_gid
    return mode if shared_directory else 0o600


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The text of a key list (a record file), read once by descriptor and bounded. Refuses a link, a
    non-regular file (a FIFO would block), a file anybody may write or another user owns (any record
    in it could be theirs; root's and the user's own are trusted) and one over MAX_KEY_FILE_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        if os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link: pass the file it names") from None
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{path} is not a regular file: pass the key list itself")
        if info.st_mode & stat.S_IWOTH:
            raise UnsafeFile(f"{path} may be written by any user (mode {stat.S_IMODE(info.st_mode):04o}), so its "
                             f"records may be anyone's: check it, then `chmod o-w {path}`")
        if info.st_uid not in (os.geteuid(), 0):
            raise UnsafeFile(f"{path} belongs to uid {info.st_uid}, who may change its records at any time: "
                             f"check it, then use a copy of your own (`cp {path} ~/keys.jsonl`)")
        data = file.read(MAX_KEY_FILE_BYTES + 1)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise UnsafeFile(f"{path} is over {MAX_KEY_FILE_BYTES >> 20} MiB: not a key list")
    return data.decode(errors="replace")


def _check_owned(path: str | os.PathLike[str], info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(f"{path} is not a regular file: kcache records keys only into a file of its own; "
                         "choose another path")
    if info.st_uid != os.geteuid():
        raise UnsafeFile(f"{path} belongs to uid {info.st_uid}, not to this user ({os.geteuid()}): another user "
                         "made it first; choose a path in a directory of yours")
    if info.st_nlink != 1:
        raise UnsafeFile(f"{path} has {info.st_nlink} links: it may be another file of yours under a second "
                         "name; choose another path")
