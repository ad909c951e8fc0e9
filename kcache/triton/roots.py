"""Where Triton's entries go: the roots of this process's settings, decided once per root.

Read from the environment without `kcache.config.Settings` (`RootSettings.from_env`): that frozen
dataclass costs about 3 ms of import, on a fresh process's first Triton hit. For the same reason the
two records here are plain classes with slots: a NamedTuple's class is built by `exec` of generated
source, about 0.06-0.2 ms each at import.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache import setting_values as values
from kcache.store import access, layout

if TYPE_CHECKING:
    from kcache.config import Settings

log = logging.getLogger("kcache")

NAMESPACE = layout.TRITON  # <root>/triton: the entries, their .staging and .locks
META = "kcache-triton.json"


class TritonRoots:
    """Where Triton's entries are written (None: nowhere) and read, in order (access.plan's answer)."""

    __slots__ = ("write", "reads", "lock_timeout_s", "remote", "lease_s")

    def __init__(self, write: Path | None, reads: tuple[Path, ...], lock_timeout_s: float, remote: Any = None,
                 lease_s: float = values.DEFAULT_REMOTE_LEASE_S) -> None:
        self.write = write
        self.reads = reads
        self.lock_timeout_s = lock_timeout_s
        self.remote = remote  # RemoteTiers of KCACHE_REMOTE (Redis, S3), or None
        self.lease_s = lease_s


_roots: dict[Path, TritonRoots] = {}
_roots_lock = threading.Lock()
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_roots_lock=threading.Lock()))


class RootSettings:
    """The settings that decide Triton's roots: those of a `Settings`, or read from the environment
    without one (`from_env`). Equal when every setting is."""

    __slots__ = ("root", "on_unwritable", "readonly", "lock_timeout_s", "remote_url", "remote_lease_s")

    def __init__(self, root: Path, on_unwritable: str, readonly: bool, lock_timeout_s: float,
                 remote_url: str | None, remote_lease_s: float) -> None:
        self.root = root
        self.on_unwritable = on_unwritable
        self.readonly = readonly
        self.lock_timeout_s = lock_timeout_s
        self.remote_url = remote_url
        self.remote_lease_s = remote_lease_s

    def __eq__(self, other: object) -> bool:
        return type(other) is RootSettings and all(getattr(self, name) == getattr(other, name)
                                                   for name in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, name) for name in self.__slots__))

    def __repr__(self) -> str:
        return "RootSettings(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__) + ")"

    @classmethod
    def of(cls, settings: Settings) -> RootSettings:
        return cls(settings.root, settings.on_unwritable, settings.readonly, settings.lock_timeout_s,
                   settings.remote_url, settings.remote_lease_s)

    @classmethod
    def from_env(cls) -> RootSettings:
        """As `Settings.from_env()` reads them, the process-wide settings checked as there too."""
        remote_url = values.remote_url_setting()
        values.check_process_settings(remote_url)
        return cls(values.default_root(), values.on_unwritable_setting(), values.readonly_setting(),
                   values.lock_timeout_setting(), remote_url, values.remote_lease_setting())


def roots(settings: Settings | None = None) -> TritonRoots:
    """The roots of this process's settings, decided once per root (a foreign-owned root: its hits are
    read, new groups go to the per-user fallback, with one warning; KCACHE_READONLY: nothing written)."""
    chosen = RootSettings.from_env() if settings is None else RootSettings.of(settings)
    with _roots_lock:
        found = _roots.get(chosen.root)
        if found is None:
            try:
                plan = access.plan(chosen.root, chosen.on_unwritable, chosen.readonly)
                found = TritonRoots(plan.write_root, plan.read_roots, chosen.lock_timeout_s,
                                    _remote(chosen.remote_url, settings) if plan.write_root is not None else None,
                                    chosen.remote_lease_s)
            except OSError as err:
                log.warning("kcache: cannot use the cache root %s for Triton (%s): Triton's kernels are compiled "
                            "without saving them. Set KCACHE_DIR to a usable directory.", chosen.root, err)
                found = TritonRoots(None, (), chosen.lock_timeout_s)
            _roots[chosen.root] = found
        return found


def _remote(remote_url: str | None, settings: Settings | None) -> Any:
    """The remote tiers of KCACHE_REMOTE for Triton's entries. Their namespace needs no toolchain
    fingerprint: Triton's key holds its version and the hash of its compiler's sources."""
    urls = values.remote_urls(remote_url)
    if not urls:
        return None
    from kcache.config import Settings  # the tiers' secret and limits: only where a remote tier is set
    from kcache.tiers.remote_chain import open_remote_tiers

    return open_remote_tiers(urls, f"{NAMESPACE}:v1", frozenset({META}), settings or Settings.from_env(),
                             exact=False, bound_meta=META)


def candidates_apart(where: TritonRoots) -> TritonRoots:
    """While Helion autotunes, it points TRITON_CACHE_DIR at a throwaway directory (`helion_autotune_*`,
    its own mkdtemp, removed when the tune ends) for its candidates, and compiles the winner again
    afterwards: kcache honours it. A candidate already in the root is read from there; the others are
    compiled (in forks, as any miss) and published into that directory, a root of their own, where
    Helion's parent finds what its precompile children built (as it would with Triton's own manager),
    and none reaches the root. A directory that is not this user's own and private is not written: the
    candidates are then compiled without being saved. Only groups are candidates: a manager keeps its
    lone files (driver and launcher modules) in `where` (kcache.triton.manager)."""
    directory = os.environ.get("TRITON_CACHE_DIR", "")
    if not os.path.basename(directory).startswith("helion_autotune_"):
        return where
    try:
        info = os.lstat(directory)
        private = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022
    except OSError:
        private = False
    if not private:
        return TritonRoots(None, where.reads, where.lock_timeout_s)
    return TritonRoots(Path(directory), (*where.reads, Path(directory)), where.lock_timeout_s)
