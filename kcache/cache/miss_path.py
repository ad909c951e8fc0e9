"""A cache's miss path, wired on its first miss: the gate that queues a process's threads per key, the
compile step and the worker pool it compiles in, and the single flight across processes and nodes.

kcache.cache.kernel_cache makes one per cache when a lookup first misses the disk (or the pool is
asked for): a process that only hits never imports this module, nor what it loads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kcache.cache.compiling import CompileStep
from kcache.cache.request import KernelRequest
from kcache.cache.single_flight import SingleFlight
from kcache.config import Settings
from kcache.tiers.disk import DiskTier

if TYPE_CHECKING:
    from kcache.compile.pool.process_pool import CompilePool
    from kcache.tiers.remote_chain import RemoteTiers


def compile_pool_for(settings: Settings, preload: Any) -> CompilePool:
    """The pool a cache of `settings` compiles in: (KCACHE_COMPILE_ISOLATION=server) this user's
    compile service, else the process's shared pool; `preload` is what its workers import first."""
    from kcache.compile.pool.shared_pools import shared_pool  # ~5 ms of imports, on the first compile only

    if settings.compile_isolation == "server":
        from kcache.compile.service.shared_pools import shared_service_pool

        return shared_service_pool(settings.compile_workers, settings.compile_timeout_s, preload,
                                   settings.server_idle_s)  # type: ignore[return-value]
    return shared_pool(settings.compile_workers, settings.compile_timeout_s, preload)


class MissPath:
    """readonly or opaque: compile privately; else [thread gate -> disk -> single flight (lock ->
    disk -> remote -> compile -> publish)], for the misses of one cache."""

    def __init__(self, backend: Any, disk: DiskTier, settings: Settings, *, readonly: bool,
                 pool: Callable[[], CompilePool], remote: Callable[[], RemoteTiers | None],
                 count: Callable[..., None], warn_once: Callable[..., None],
                 disk_hit: Callable[[KernelRequest, str], None], grown: Callable[[], None]) -> None:
        self._backend = backend
        self._disk = disk
        self._readonly = readonly
        self._warn_once = warn_once
        self._disk_hit = disk_hit  # counts and logs a hit, as the cache's own disk lookup does
        self._grown = grown  # after a miss the single flight served: the cache may have grown
        self.compiler = CompileStep(backend, disk, isolation=settings.compile_isolation, pool=pool, count=count)
        self.flight = SingleFlight(backend, disk, self.compiler, lock_timeout_s=settings.lock_timeout_s,
                                   remote=remote, remote_lease_s=settings.remote_lease_s, count=count,
                                   warn_once=warn_once)
        self._key_threads: dict[str, threading.Lock] = {}
        self._key_threads_guard = threading.Lock()

    def get(self, request: KernelRequest) -> Any:
        """The kernel of `request`, which the disk did not hold a moment ago."""
        backend = self._backend
        # Not a miss yet: a miss is a lookup that compiles (kcache.cache.compiling counts it); one
        # served by another process's or thread's compile, waited for, is a hit.
        if self._readonly:
            return self.compiler.compile_private(request)
        opaque = getattr(request.context, "opaque", "")
        if opaque:
            # A callback whose effect cannot be keyed: compiled here, where it is registered, and
            # kept in memory only (its memory key holds the callback's handle).
            self._warn_once(f"opaque:{opaque}", "kcache: compiling %s in this process and not caching it on "
                            "disk: %s", backend.kernel_name(request.func), opaque)
            return self.compiler.compile_private(request, in_process=True)
        with self._thread_gate(request.key):
            # Another thread of this process may have finished it meanwhile.
            kernel = self._disk.load(request.key, request.loader(backend), quarantine=False)
            if kernel is not None:
                self._disk_hit(request, ", another thread's compile")
                return kernel
            kernel = self.flight.get(request)
        self._grown()
        return kernel

    @contextlib.contextmanager
    def _thread_gate(self, key: str) -> Iterator[None]:
        """Threads of one process missing the same key queue here, not on the file lock."""
        with self._key_threads_guard:
            gate = self._key_threads.setdefault(key, threading.Lock())
        with gate:
            yield
