"""A root walked by descriptor: no link below a root is followed, and what is checked is what is used.

Every directory below a root is opened with O_NOFOLLOW relative to its parent's descriptor, so a
symlink planted where kcache expects one of its own directories (`.trash`, `.staging`, an entry)
is refused, not followed; deletion works only below descriptors opened this way, and a tree is
removed by descriptor too (a link inside it is unlinked, never followed). The root itself is the
path the user configured: a symlinked KCACHE_DIR is the user's choice.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("kcache")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# open(O_NOFOLLOW|O_DIRECTORY) of a symlink or of a non-directory: something that is not ours.
NOT_A_DIRECTORY_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR})


class NotADirectoryOfOurs(OSError):
    """A symlink or a non-directory where kcache expects one of its own directories."""


def open_root(root: Path) -> int:
    """A descriptor of the root directory (its path may go through links the user configured)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir_at(dir_fd: int, name: str) -> int | None:
    """A descriptor of directory `name` in `dir_fd`, or None if there is none.

    Raises NotADirectoryOfOurs for a symlink or a file there: never followed, never deleted.
    """
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in NOT_A_DIRECTORY_ERRNOS:
            raise NotADirectoryOfOurs(err.errno, f"not a directory of kcache's (a symlink or a file): {name}",
                                      name) from None
        raise


def open_dirs_at(dir_fd: int, *names: str) -> int | None:
    """open_dir_at along a path of names, each relative to the last; None if one is missing."""
    current = os.dup(dir_fd)
    for name in names:
        try:
            following = open_dir_at(current, name)
        finally:
            os.close(current)
        if following is None:
            return None
        current = following
    return current


@contextlib.contextmanager
def subdir(root: Path, *names: str) -> Iterator[int | None]:
    """`with subdir(root, ".trash") as fd:` the directory's descriptor (None if missing), closed after."""
    root_fd = open_root(root)
    try:
        fd = open_dirs_at(root_fd, *names)
    finally:
        os.close(root_fd)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def remove_tree_at(dir_fd: int, name: str, why: str) -> bool:
    """Remove `name` in `dir_fd` and everything below it, by descriptor. A link is unlinked, never
    followed. A failure is logged, not raised (it must not hide the error that led here); returns
    whether `name` is gone. A tree deeper than MAX_REMOVAL_DEPTH (none that kcache makes: planted)
    is left in place with one warning that names it."""
    try:
        _remove_at(dir_fd, name)
    except FileNotFoundError:
        pass
    except _TooDeep:
        log.warning("kcache: not removing %s while %s: it is more than %d directories deep, which kcache never "
                    "makes (someone planted it). Remove it by hand (rm -r), as its owner or root",
                    _path_of(dir_fd, name), why, MAX_REMOVAL_DEPTH)
    except OSError as err:
        log.warning("kcache: could not remove %s while %s: %s", name, why, err)
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return False


# kcache's own trees are an entry's files, or a staging directory's: two levels. The bound keeps a
# removal's open descriptors (one per level) few, whatever was planted.
MAX_REMOVAL_DEPTH = 64


class _TooDeep(OSError):
    pass


def _remove_at(dir_fd: int, name: str) -> None:
    """Depth first, by an explicit stack of (descriptor, entries left) levels: no recursion, so a
    planted tree thousands of levels deep costs a warning, never a RecursionError."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    levels: list[tuple[int, str, list[str]]] = []  # (its descriptor, its name in the level above, names left)
    try:
        levels.append((_open_unchanged(dir_fd, name, info), name, []))
        levels[-1][2].extend(os.listdir(levels[-1][0]))
        while levels:
            fd, _, left = levels[-1]
            if not left:  # this level is empty now: remove it from its parent
                os.close(fd)
                _, own_name, _ = levels.pop()
                os.rmdir(own_name, dir_fd=levels[-1][0] if levels else dir_fd)
                continue
            child = left.pop()
            try:
                child_info = os.stat(child, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(child_info.st_mode):
                    os.unlink(child, dir_fd=fd)
                    continue
                if len(levels) >= MAX_REMOVAL_DEPTH:
                    raise _TooDeep(errno.ELOOP, f"{name} is more than {MAX_REMOVAL_DEPTH} levels deep")
                child_fd = _open_unchanged(fd, child, child_info)
            except FileNotFoundError:
                continue
            levels.append((child_fd, child, os.listdir(child_fd)))
    finally:
        for fd, _, _ in levels:
            os.close(fd)


def _path_of(dir_fd: int, name: str) -> str:
    """`name` in `dir_fd` as a path, for a message (the directory's path as the kernel knows it now)."""
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
    except OSError:
        return name


def _open_unchanged(dir_fd: int, name: str, info: os.stat_result) -> int:
    """A descriptor of directory `name`, refused where it was replaced between the stat and the open."""
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    if os.fstat(fd)[:2] != info[:2]:
        os.close(fd)
        raise OSError(errno.ESTALE, f"{name} changed while being removed")
    return fd
