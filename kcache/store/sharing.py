"""Who may write under a cache root: its owner alone (the default), or a group (KCACHE_UMASK).

ccache's recipe for a cache shared by a team or by CI runners of several
UIDs: a umask that leaves the group write permission, and setgid
directories, so that everything created below the root belongs to the
root's group. kcache cannot change the process's umask (it is shared by
every thread of the program it runs in), so it sets the mode of each file
and directory it creates explicitly, from KCACHE_UMASK. The setting is read
from the environment on each use, process-wide, so compile workers follow it.

Files kcache writes once and only ever replaces by rename (entry
components, manifests, logs, memos) are read-only for everyone: published
entries stay immutable by mode too. Directories stay writable by the group,
because moving an entry directory into `.trash/` or `.quarantine/` needs
write permission on the directory itself (its `..` changes).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

UMASK_ENV = "KCACHE_UMASK"
GROUP_ENV = "KCACHE_GROUP"
WRITE_ONCE_FILE_MODE = 0o444
SHARED_FILE_MODE = 0o666  # lock files: every member must open them for writing
PRIVATE_ROOT_MODE = 0o700


def parse_umask(text: str) -> int:
    """An octal umask such as 002, 0002 or 007."""
    value = text.strip()
    try:
        umask = int(value, 8)
    except ValueError:
        raise ValueError(f"{UMASK_ENV}={text!r} is not an octal umask (examples: 002, 007)") from None
    if not 0 <= umask <= 0o777:
        raise ValueError(f"{UMASK_ENV}={text!r} is not an octal umask between 000 and 777")
    return umask


def configured_umask() -> int | None:
    """KCACHE_UMASK, or None: kcache then leaves modes to the process's umask (and the 0700 root)."""
    raw = os.environ.get(UMASK_ENV, "").strip()
    return parse_umask(raw) if raw else None


def group_mode() -> bool:
    """Whether KCACHE_UMASK lets the group write: the cache is shared by a group."""
    umask = configured_umask()
    return umask is not None and not umask & stat.S_IWGRP


def configured_group() -> int | None:
    """KCACHE_GROUP as a gid (a name or a number), or None."""
    raw = os.environ.get(GROUP_ENV, "").strip()
    if not raw:
        return None
    if raw.isdigit():
        return int(raw)
    import grp  # here: a group given by name (a hit without KCACHE_GROUP loads no grp)

    try:
        return grp.getgrnam(raw).gr_gid
    except KeyError:
        raise ValueError(f"{GROUP_ENV}={raw!r} names no group on this machine") from None


def root_mode() -> int:
    """The mode of a root kcache creates: 0700, or 2770 (less the umask) in group mode."""
    if not group_mode():
        return PRIVATE_ROOT_MODE
    return (0o2770 & ~(configured_umask() or 0)) | stat.S_ISGID


def dir_mode() -> int | None:
    """The mode of a directory kcache creates below a root; None: the process's umask decides."""
    umask = configured_umask()
    if umask is None:
        return None
    mode = 0o777 & ~umask
    return mode | stat.S_ISGID if mode & stat.S_IWGRP else mode


def file_mode(requested: int) -> int | None:
    """The exact mode of a file kcache creates with `requested` permissions; None: the process's
    umask decides."""
    umask = configured_umask()
    return None if umask is None else requested & ~umask


def fix_mode(path: Path | int, mode: int | None) -> None:
    """Give a file or directory this process just created exactly `mode` (chmod ignores the umask)."""
    if mode is None:
        return
    if isinstance(path, int):
        os.fchmod(path, mode)
    else:
        os.chmod(path, mode)


def trusted_group(root: Path) -> int | None:
    """In group mode, the group whose members' directories are trusted: KCACHE_GROUP, else the
    root's group; only if this process belongs to it. None outside group mode."""
    if not group_mode():
        return None
    gid = configured_group()
    if gid is None:
        try:
            gid = os.stat(root).st_gid
        except OSError:
            return None
    return gid if gid == os.getegid() or gid in os.getgroups() else None
