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

import atexit
import contextlib
import errno
import logging
import os
import stat
import threading
from pathlib import Path

from kcache.errors import UnwritableCache
from kcache.store import dirfd, layout, sharing
from kcache.store.components import KERNELS
from kcache.store.user_dirs import user_cache_dir

log = logging.getLogger("kcache")

POLICIES = ("fallback", "readonly", "error")
# A write under the root failed because of who we are or how it is mounted, not because of a fault.
UNWRITABLE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
# The directories kcache writes into below a root; each one that exists must be writable too.
WRITTEN_DIRS = (KERNELS, "autotuner", layout.STAGING, layout.LOCKS, layout.LOGS, layout.TOOLCHAIN, layout.STATS,
                layout.QUARANTINE, layout.TRASH)

_warned: set[str] = set()
_warned_lock = threading.Lock()
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_warned_lock=threading.Lock()))


class RootPlan:
    """Where a cache writes (None: nowhere), and where it looks for hits, in order. (A class with
    slots: a dataclass costs about 1 ms at import and a NamedTuple about 0.1 ms, on every fresh
    process's hit path.)"""

    __slots__ = ("write_root", "read_roots")

    def __init__(self, write_root: Path | None, read_roots: tuple[Path, ...]) -> None:
        self.write_root = write_root
        self.read_roots = read_roots


def create_root(root: Path) -> None:
    """Create `root` (and its parents) if missing, with its marker; a root kcache creates is 0700,
    or 2770 in group mode. An existing directory is marked if it is kcache's (claim_root)."""
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        mode = sharing.root_mode()
        try:
            os.mkdir(root, mode)
            os.chmod(root, mode)  # mkdir applies the process's umask, and drops setgid on some systems
        except FileExistsError:
            pass
    fd = dirfd.open_root(root)
    try:
        claim_root(fd, root)
    finally:
        os.close(fd)


# What kcache itself puts in a root. A directory holding only these (or nothing) is kcache's.
ROOT_NAMES = frozenset({KERNELS, *layout.NAMESPACES, layout.STAGING, layout.LOCKS, layout.LOGS, layout.TOOLCHAIN,
                        layout.STATS, layout.QUARANTINE, layout.TRASH, layout.ROOT_MARKER, layout.GC_STAMP})


def claim_root(root_fd: int, root: Path) -> bool:
    """Whether the directory `root_fd` is a kcache root: it carries the marker, or holds nothing but
    what kcache puts in a root (then the marker is added: a root of an older kcache, a new one).
    A directory with anything else in it (a mistaken KCACHE_DIR=$HOME) is never claimed, and gc
    deletes nothing there."""
    try:
        os.stat(layout.ROOT_MARKER, dir_fd=root_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        pass
    foreign = sorted(set(os.listdir(root_fd)) - ROOT_NAMES)
    if foreign:
        _warn_once(root, f"kcache: {root} holds files that are not kcache's ({', '.join(foreign[:3])}"
                   f"{', ...' if len(foreign) > 3 else ''}) and no {layout.ROOT_MARKER} marker: kcache will use "
                   "it, but its gc deletes nothing there. Point KCACHE_DIR at a directory of kcache's own.")
        return False
    try:
        fd = os.open(layout.ROOT_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     sharing.WRITE_ONCE_FILE_MODE, dir_fd=root_fd)
    except FileExistsError:
        return True
    except OSError as err:
        if err.errno in UNWRITABLE_ERRNOS:
            return False
        raise
    try:
        os.write(fd, b"kcache root\n")
    finally:
        os.close(fd)
    return True


NOT_A_DIRECTORY = "not a directory"
READ_ONLY_FILESYSTEM = "is on a read-only filesystem"
UNREADABLE = "you cannot read it"


def unreadable_reason(root: Path) -> str:
    """Why this process cannot read the directory `root` (list and enter it), or "" if it can or it is
    no directory. A root kcache creates is 0700: another uid sees it, and no more."""
    if not root.is_dir() or os.access(root, os.R_OK | os.X_OK):
        return ""
    return f"{UNREADABLE}: {_describe(root)}"


def unreadable_fix(root: Path) -> str:
    """What lets another uid read a root: its owner's chmod (a root kcache creates is private), or a group."""
    return (f"its owner makes it readable (chmod 0755 {root}: a root kcache creates is 0700, private; for a CI "
            "cache, create the root first with mkdir -m 0755, docs/operations.md), shares it through a group "
            "(KCACHE_UMASK=002 and a setgid root), or point KCACHE_DIR at a directory of yours")


def unwritable_reason(root: Path) -> str:
    """Why this process cannot write under `root`, or "" if it can (creating it if missing)."""
    if root.is_symlink() and not root.exists():
        return f"it is a dangling symbolic link, {NOT_A_DIRECTORY}"
    if root.exists() and not root.is_dir():
        return f"it is a file, {NOT_A_DIRECTORY}"
    unreadable = unreadable_reason(root)  # before create_root: it exists, it is only closed to us
    if unreadable:
        return unreadable
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
    fix = unwritable_fix(reason, policy, root)
    if policy == "error":
        raise UnwritableCache(str(root), reason, fix)
    fallback = fallback_root(root) if policy == "fallback" else None
    if fallback is not None and unwritable_reason(fallback):
        fallback = None
    # A mistake in KCACHE_DIR, or a root closed to this user: nothing to read there (never "reading its hits").
    reads = () if NOT_A_DIRECTORY in reason or reason.startswith(UNREADABLE) else (root,)
    if fallback is None:
        doing = ("Serving its hits and compiling misses without saving them (read-only)" if reads
                 else "Compiling misses without saving them")
        _warn_once(root, f"kcache: the cache root {root} is not writable by this process: {reason}. {doing}. "
                   f"Fix: {fix}.")
        return RootPlan(None, reads)
    _warn_once(root, f"kcache: the cache root {root} is not writable by this process: {reason}. "
               f"{'Reading its hits, and saving' if reads else 'Saving'} new kernels in {fallback} instead. "
               f"Fix: {fix}" + ("." if "KCACHE_ON_UNWRITABLE" in fix else
                                 "; KCACHE_ON_UNWRITABLE=readonly|error chooses another policy."))
    return RootPlan(fallback, (fallback, *reads))


def unwritable_fix(reason: str, policy: str = "fallback", root: Path | None = None) -> str:
    """The fix that fits why a root cannot be written (unwritable_reason): on a read-only filesystem no
    permission or group helps, only another root or reading this one (KCACHE_ON_UNWRITABLE=readonly)."""
    if NOT_A_DIRECTORY in reason:  # a mistake in KCACHE_DIR, not a matter of permissions
        return "point KCACHE_DIR (or the root you pass) at a directory"
    if reason.startswith(UNREADABLE):
        return unreadable_fix(root or Path("the root"))
    if READ_ONLY_FILESYSTEM in reason:
        return "point KCACHE_DIR at a directory on a writable filesystem" + (
            "" if policy == "readonly" else ", or set KCACHE_ON_UNWRITABLE=readonly to only read this one")
    return ("share it through a group (KCACHE_UMASK=002 and a setgid root, docs/operations.md), ask its owner to "
            "give it to you, or point KCACHE_DIR at a writable directory")


def fallback_root(root: Path) -> Path:
    """This user's own root: the per-user cache directory, or a private one when that is `root`."""
    mine = Path(user_cache_dir("kcache"))
    if _same_path(mine, root):
        return private_root()
    return mine


_private_roots: list[Path] = []


def private_root() -> Path:
    """A root nobody else can have made or entered: `$XDG_RUNTIME_DIR/kcache` where the runtime
    directory is ours and private (checked each time), else a fresh mkdtemp directory of this
    process. Never a predictable name in a shared tmp: another user could create it first."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private_and_ours(Path(runtime)):
        candidate = Path(runtime) / "kcache"
        with contextlib.suppress(FileExistsError):
            os.mkdir(candidate, 0o700)
        if _private_and_ours(candidate):
            return candidate
    if not _private_roots:
        import shutil
        import tempfile

        made = Path(tempfile.mkdtemp(prefix=f"kcache-{os.geteuid()}-"))  # 0700, a name nobody could predict
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        _private_roots.append(made)
    return _private_roots[0]


def _private_and_ours(directory: Path) -> bool:
    try:
        info = os.stat(directory, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _describe(directory: Path) -> str:
    try:
        info = os.stat(directory)
    except OSError as err:
        return f"{directory}: {err.strerror}"
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        return f"{directory} {READ_ONLY_FILESYSTEM}"
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
    import pwd  # here, as grp below: only a message names a user (a hit loads neither module)

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    import grp

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


def is_private_and_ours(directory: Path) -> bool:
    """A real directory (not a link) owned by this user that nobody else may enter or write."""
    return _private_and_ours(directory)
