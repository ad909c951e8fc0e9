"""Can this process write its cache root, and what it does when it cannot (KCACHE_ON_UNWRITABLE).

Decided once, when a cache opens: a root created by another user (a CI
cache mounted into a container, a team directory) must not surface as a
PermissionError deep inside a compile. The policies:

- fallback (default): hits are still read from the root (after the trust
  check); misses compile into a per-user root, which is also read.
- readonly: hits from the root, misses compiled privately, nothing written.
- error: UnwritableCache, naming the directory, its owner and mode, and the fix.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from kcache.errors import UnwritableCache
from kcache.store import layout, sharing
from kcache.store.components import KERNELS

log = logging.getLogger("kcache")

POLICIES = ("fallback", "readonly", "error")
# A write under the root failed because of who we are or how it is mounted, not because of a fault.
UNWRITABLE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
# The directories kcache writes into below a root; each one that exists must be writable too.
WRITTEN_DIRS = (KERNELS, "autotuner", layout.STAGING, layout.LOCKS, layout.LOGS, layout.TOOLCHAIN, layout.STATS,
                layout.QUARANTINE, layout.TRASH)

_warned: set[str] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class RootPlan:
    """Where a cache writes (None: nowhere), and where it looks for hits, in order."""

    write_root: Path | None
    read_roots: tuple[Path, ...]


def create_root(root: Path) -> None:
    """Create `root` (and its parents) if missing; a root kcache creates is 0700, or 2770 in group mode."""
    if root.is_dir():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    mode = sharing.root_mode()
    try:
        os.mkdir(root, mode)
    except FileExistsError:
        return
    os.chmod(root, mode)  # mkdir applies the process's umask, and drops setgid on some systems


def unwritable_reason(root: Path) -> str:
    """Why this process cannot write under `root`, or "" if it can (creating it if missing)."""
    try:
        create_root(root)
    except OSError as err:
        if err.errno not in UNWRITABLE_ERRNOS:
            raise
        return f"it does not exist and cannot be created ({err.strerror}); {_describe(_existing_parent(root))}"
    for directory in (root, *(root / name for name in WRITTEN_DIRS)):
        if directory is not root and not directory.is_dir():
            continue
        if not os.access(directory, os.W_OK | os.X_OK):
            return _describe(directory)
    return ""


def plan(root: Path, policy: str, readonly: bool) -> RootPlan:
    """Decide where a cache on `root` writes and reads; warns once per root and process."""
    if readonly:
        return RootPlan(None, (root,))
    reason = unwritable_reason(root)
    if not reason:
        return RootPlan(root, (root,))
    if policy == "error":
        raise UnwritableCache(str(root), reason)
    fallback = fallback_root(root) if policy == "fallback" else None
    if fallback is not None and unwritable_reason(fallback):
        fallback = None
    if fallback is None:
        _warn_once(root, f"kcache: the cache root {root} is not writable by this process: {reason}. Serving its "
                   "hits and compiling misses without saving them (read-only). Fix: share it through a group "
                   "(KCACHE_UMASK=002, docs/operations.md) or point KCACHE_DIR at a writable directory.")
        return RootPlan(None, (root,))
    _warn_once(root, f"kcache: the cache root {root} is not writable by this process: {reason}. Reading its "
               f"hits, and saving new kernels in {fallback} instead. Fix: share it through a group "
               "(KCACHE_UMASK=002, docs/operations.md), or point KCACHE_DIR at a writable directory; "
               "KCACHE_ON_UNWRITABLE=readonly|error chooses another policy.")
    return RootPlan(fallback, (fallback, root))


def fallback_root(root: Path) -> Path:
    """This user's own root: the per-user cache directory, or `<tmp>/kcache-<uid>` when that is `root`."""
    mine = Path(platformdirs.user_cache_dir("kcache", appauthor=False))
    if _same_path(mine, root):
        return Path(tempfile.gettempdir()) / f"kcache-{os.geteuid()}"
    return mine


def _describe(directory: Path) -> str:
    try:
        info = os.stat(directory)
    except OSError as err:
        return f"{directory}: {err.strerror}"
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        return f"{directory} is on a read-only filesystem"
    return (f"{directory} is owned by {_user(info.st_uid)}:{_group(info.st_gid)} with mode "
            f"{stat.filemode(info.st_mode)}, and you are {_user(os.geteuid())} in groups "
            f"{', '.join(sorted({_group(g) for g in (os.getegid(), *os.getgroups())}))}")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _same_path(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _warn_once(root: Path, message: str) -> None:
    with _warned_lock:
        if str(root) in _warned:
            return
        _warned.add(str(root))
    log.warning("%s", message)
