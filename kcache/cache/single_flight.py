"""One compile per key across processes (the key's file lock) and nodes (the remote tier's lease).

Waiters stop waiting as soon as the holder's entry appears and load it
without the lock: queueing them through it would serialize N loads. Under
the lock: the disk once more, then the remote tier, then the compile step.
Trouble with the remote tier at any point means: compile locally.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kcache import lookup_log
from kcache.cache.compiling import CompileStep
from kcache.cache.request import KernelRequest
from kcache.errors import CacheLockTimeout
from kcache.store import access, layout
from kcache.store.arrivals import Arrivals
from kcache.store.locks import NOT_A_LOCK_FILE_ERRNOS, KeyLock
from kcache.tiers.disk import DiskTier

if TYPE_CHECKING:
    from kcache.tiers.remote_chain import RemoteTiers  # loaded only where KCACHE_REMOTE is set

log = logging.getLogger("kcache")


class SingleFlight:
    """lock -> disk -> remote -> compile -> publish, for the misses of one cache."""

    def __init__(self, backend: Any, disk: DiskTier, compiler: CompileStep, *, lock_timeout_s: float,
                 remote: Callable[[], RemoteTiers | None], remote_lease_s: float,
                 count: Callable[..., None], warn_once: Callable[..., None]) -> None:
        self._backend = backend
        self._disk = disk
        self._store = disk.store
        self._compiler = compiler
        self._lock_timeout_s = lock_timeout_s
        self._remote = remote
        self._remote_lease_s = remote_lease_s
        self._count = count
        self._warn_once = warn_once

    def get(self, request: KernelRequest) -> Any:
        loader = request.loader(self._backend)
        lock = KeyLock(self._store.root / layout.LOCKS / f"{request.key}.lock", request.key)
        entry = self._store.entry_path(request.key)
        give_up_when: Any = entry.is_dir
        # One KCACHE_LOCK_TIMEOUT for the whole call: the wait for the local lock and the wait for
        # another node's lease share it (each its own timeout made the bound twice the setting).
        deadline = time.monotonic() + self._lock_timeout_s
        arrivals = Arrivals(self._store.entries_dir, entry.name)  # a waiter wakes at the publish
        try:
            while True:
                started = time.monotonic()
                try:
                    waited = lock.acquire(max(0.0, deadline - started), give_up_when,
                                          arrivals.nap if give_up_when is not None else time.sleep)
                except CacheLockTimeout:
                    raise
                except OSError as err:
                    if err.errno not in access.UNWRITABLE_ERRNOS | NOT_A_LOCK_FILE_ERRNOS:
                        raise
                    # The root was writable when this cache opened; it is not now, or something that is
                    # not ours stands where the lock goes (a planted symlink). This call still gets its
                    # kernel, compiled without saving it, rather than a PermissionError.
                    self._warn_once("lock-denied", "kcache: cannot take the compile lock %s (%s); compiling %s "
                                    "without saving it. Check the owner and mode of %s.", lock.path,
                                    err.strerror or err, self._backend.kernel_name(request.func), self._store.root)
                    arrivals.close()
                    return self._compiler.compile_private(request)
                if waited is None:
                    self._waited(request, time.monotonic() - started)
                    kernel = self._disk.load(request.key, loader, quarantine=False)
                    if kernel is not None:
                        self._hit(request, "disk, another process's compile")
                        return kernel
                    give_up_when = None  # it is corrupt or went away: take the lock to repair it
                    continue
                if waited > 0:
                    self._waited(request, waited)
                break
        finally:
            arrivals.close()  # before the compile: a fork of this process would inherit the watch
        with lock:
            kernel = self._disk.load(request.key, loader, quarantine=True)
            if kernel is not None:
                self._hit(request, "disk, published before the lock was ours")
                return kernel
            remote = self._remote()
            if remote is None:
                return self._compiler.compile_and_publish(request)
            return self._cluster_once(request, remote, max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------ the remote tier

    def _cluster_once(self, request: KernelRequest, remote: RemoteTiers, timeout_s: float) -> Any:
        """Under the local lock: a remote hit, or wait (what is left of KCACHE_LOCK_TIMEOUT) for the node
        holding the remote lease to upload, or compile and upload."""
        claim = remote.claim(request.key, self._remote_lease_s, timeout_s,
                             lambda: self._load_remote(request, remote))
        if claim.found is not None:
            return claim.found
        if claim.timed_out:
            log.warning("kcache: another node held the compile lease of %s (key %s) in %s for KCACHE_LOCK_TIMEOUT "
                        "(%.0f s) without uploading it; compiling it here too (raise KCACHE_LOCK_TIMEOUT if its "
                        "compiles take longer)", self._backend.kernel_name(request.func), request.key[:16],
                        remote.url, self._lock_timeout_s)
        try:
            kernel = self._compiler.compile_and_publish(request)
            self.upload(remote, request.key)
            return kernel
        finally:
            if claim.lease is not None:
                claim.lease.release()

    def _load_remote(self, request: KernelRequest, remote: RemoteTiers) -> Any | None:
        tier = remote.fetch_into(self._store, request.key)
        if tier is None:
            return None
        kernel = self._disk.load(request.key, request.loader(self._backend), quarantine=True)
        if kernel is not None:
            self._count(remote_hits=1, **{f"{tier}_hits": 1})
            lookup_log.lookup("tilelang", "hit", self._backend.kernel_name(request.func), request.key, f" ({tier})")
        return kernel

    def _hit(self, request: KernelRequest, how: str) -> None:
        self._count(disk_hits=1)
        lookup_log.lookup("tilelang", "hit", self._backend.kernel_name(request.func), request.key, f" ({how})")

    def _waited(self, request: KernelRequest, seconds: float) -> None:
        self._count(lock_waits=1, lock_wait_seconds=seconds)
        lookup_log.lookup("tilelang", "wait", self._backend.kernel_name(request.func), request.key,
                          f": {seconds:.1f} s for another process's compile")

    def upload(self, remote: RemoteTiers, key: str) -> bool:
        """The local entry `key`, verified, into the remote tier; whether it went."""
        if remote.upload_from(self._store, key):
            self._count(uploads=1)
            return True
        return False
