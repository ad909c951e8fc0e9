"""kcache's exceptions of the cache on disk: its locks, its entries, its root, loading a kernel's library."""

from __future__ import annotations

import errno as _errno
import os

from kcache.errors.base import KCacheError, _Explained


class CacheLockTimeout(KCacheError, TimeoutError):
    """Waiting for another process's compile of the same kernel took too long."""

    def __init__(self, lock_file: str, timeout: float, key: str) -> None:
        self.lock_file = lock_file
        self.timeout = timeout
        self.key = key
        self._init_args = (lock_file, timeout, key)
        super().__init__(
            f"timed out after {timeout:g} s waiting for the compile lock {lock_file} (key {key[:16]}). "
            "Another process holds it and is still compiling, or is stuck. "
            "Raise KCACHE_LOCK_TIMEOUT for very long compiles, or find the holder with `fuser -v` on the lock file."
        )


class PublishError(_Explained, KCacheError, OSError):
    """Publishing an entry failed for a reason other than losing a race.

    Subclasses OSError with the original errno, so `err.errno` works as usual.
    """

    def __init__(self, path: str, err: OSError, action: str) -> None:
        code = err.errno if err.errno is not None else _errno.EIO
        self.path = path
        self.action = action
        self.cause = err
        self._init_args = (path, err, action)
        name = _errno.errorcode.get(code, str(code))
        super().__init__(code, f"{action} {path} failed with {name} ({os.strerror(code)}): {err}. {_hint(code)}")


class CorruptEntry(KCacheError, ValueError):
    """A published entry does not match its manifest or cannot be loaded."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        self._init_args = (path, reason)
        super().__init__(f"cache entry {path} is corrupt: {reason}")


class UnwritableCache(_Explained, KCacheError, PermissionError):
    """The cache root cannot be written by this process, and KCACHE_ON_UNWRITABLE=error."""

    def __init__(self, root: str, reason: str, fix: str | None = None) -> None:
        self.root = root
        self.reason = reason
        self._init_args = (root, reason, fix)
        # The fix fits the cause (kcache.store.access.unwritable_fix): no group helps a read-only mount.
        fix = fix or ("share it through a group (KCACHE_UMASK=002 and a setgid root, see docs/operations.md), give "
                      "it to this user, or point KCACHE_DIR elsewhere")
        super().__init__(
            _errno.EACCES,
            f"the kcache root {root} is not writable by this process: {reason}. Fix: {fix}; "
            "KCACHE_ON_UNWRITABLE=fallback reads it and writes a per-user root instead",
        )


class NoExecError(_Explained, KCacheError, OSError):
    """A kernel library cannot be mapped where it is (noexec), nor from any copy kcache may make."""

    def __init__(self, library: str, mount: str | None, refusals: str) -> None:
        self.library = library
        self.mount = mount
        self.refusals = refusals
        self._init_args = (library, mount, refusals)
        where = f"{mount} is mounted noexec" if mount else "this machine refuses to map its code"
        super().__init__(
            _errno.EPERM,
            f"cannot load {library}: {where}, and no copy could be loaded either ({refusals}). The entry is "
            "intact and was left alone. Fix: point KCACHE_DIR at a filesystem mounted with exec, or set "
            "KCACHE_EXEC_DIR to a directory on one",
        )


class LocalLoadError(_Explained, KCacheError, OSError):
    """A verified entry cannot be loaded for a reason of this machine's (a library it links is missing)."""

    def __init__(self, library: str, cause: str) -> None:
        self.library = library
        self.cause = cause
        self._init_args = (library, cause)
        super().__init__(
            _errno.ENOENT,
            f"cannot load {library}: {cause}. The entry is intact and was left alone: this machine lacks "
            "something it links (the CUDA driver's libcuda, say). Fix the environment (LD_LIBRARY_PATH, the driver)",
        )


class UntrustedEntry(_Explained, KCacheError, PermissionError):
    """An entry (or a directory above it up to the root) that someone else could have written: it is
    never loaded, never unpickled and never quarantined (it is not the entry's fault)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        self._init_args = (path, reason)
        super().__init__(
            _errno.EACCES,
            f"not loading {path}: {reason}. Fix the ownership or mode (chmod go-w), share the root through a "
            "group (KCACHE_UMASK, docs/operations.md), or point KCACHE_DIR at a root of your own",
        )


def _hint(code: int) -> str:
    hints = {
        _errno.ENOSPC: "The cache filesystem is full: free space or point KCACHE_DIR elsewhere.",
        _errno.EDQUOT: "The disk quota is exhausted: free space or point KCACHE_DIR elsewhere.",
        _errno.EROFS: "The cache filesystem is read-only: point KCACHE_DIR at a writable directory.",
        _errno.EACCES: "No permission: check the owner and mode of the cache root, or point KCACHE_DIR elsewhere.",
        _errno.EPERM: "No permission: check the owner and mode of the cache root, or point KCACHE_DIR elsewhere.",
        _errno.EXDEV: "Staging and entries are on different filesystems: do not mount over parts of the cache root.",
    }
    return hints.get(code, "Check the cache filesystem's health.")
