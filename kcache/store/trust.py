"""The trust check before kcache maps code (dlopen) or unpickles it.

Whoever can write an entry, or any directory above it up to the cache root,
can swap its files, manifest included, and so run code in every process that
loads it. An entry is trusted only if it and every directory up to the root
are directories (not symlinks) owned by the current user or root (or, in
group mode, by the cache's group, of which this process is a member), and
not writable by every user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kcache.store import sharing

# (dev, ino, uid, gid, mode, trusted group) of directories already checked
_trusted_dirs: set[tuple[int, int, int, int, int, int | None]] = set()


def untrusted_reason(path: Path, root: Path) -> str:
    """Why `path` (inside `root`) is no safe place to load code from, or "" if it is."""
    me = os.geteuid()
    group = sharing.trusted_group(root)
    current = Path(path)
    chain = [current, *[p for p in current.parents if p == root or root in p.parents]]
    for directory in chain:
        try:
            info = os.stat(directory, follow_symlinks=False)
        except OSError as err:
            return f"cannot stat {directory}: {err.strerror or err}"
        identity = (info.st_dev, info.st_ino, info.st_uid, info.st_gid, info.st_mode, group)
        if identity in _trusted_dirs:
            continue
        if not stat.S_ISDIR(info.st_mode):
            return f"{directory} is not a directory (a symlink?)"
        if info.st_uid not in (me, 0) and (group is None or info.st_gid != group):
            also = f" nor the cache's group (gid {group})" if group is not None else ""
            return f"{directory} is owned by uid {info.st_uid}, neither you (uid {me}) nor root{also}"
        if info.st_mode & stat.S_IWOTH:
            return f"{directory} is writable by every user (mode {stat.filemode(info.st_mode)})"
        if directory != current:  # entries come and go; the directories above them are worth remembering
            _trusted_dirs.add(identity)
    return ""
