"""`KernelCache`: memory, then local disk, then one compile across all processes."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache.store import access
from kcache.store import exec_copy
from kcache.store import layout
from kcache.store.components import KERNELS, LIBRARY
from kcache.config import Settings
from kcache.maintenance.eviction import note_use
from kcache.errors import CacheLockTimeout, CorruptEntry, KCacheError, LocalLoadError, PublishError, UnwritableCache
from kcache.store.fsutil import remove_tree, write_durable
from kcache.keys import ENTRY_FORMAT, canonical_json, derive_key
from kcache.store.locks import KeyLock
from kcache.store.manifest import MANIFEST_NAME
from kcache.maintenance.gc import GcReport, collect_garbage, gc_is_due
from kcache.tiers.memory import MemoryTier
from kcache.maintenance.stats import CacheStats, stats_file
from kcache.store.entries import EntryStore, PublishOutcome
from kcache.store.trust import untrusted_reason

if TYPE_CHECKING:
    from tilelang.jit import JITKernel
    from tvm.tirx import PrimFunc

    from kcache.compile.pool import CompilePool
    from kcache.tiers.remote import RemoteTier

log = logging.getLogger("kcache")


class KernelCache:
    """A kernel cache on one root directory, shared safely by any number of processes."""

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, settings: Settings | None = None, backend: Any = None,
        compile_pool: CompilePool | None = None, remote: str | None = None,
    ) -> None:
        """`backend` replaces TileLang (a module-like object with kcache.tilelang.backend's
        functions); the stress harness's synthetic compiler is one. None means TileLang.
        `compile_pool`: compile in this pool instead of the process's shared one. `remote`: a Redis
        URL for the remote tier (default: KCACHE_REMOTE)."""
        self.settings = settings if settings is not None else Settings.from_env(root)
        if remote is not None:
            self.settings = dataclasses.replace(self.settings, remote_url=remote)
        try:
            # Decided here, not deep inside a compile: can we write the root, and if not, where instead.
            plan = access.plan(self.settings.root, self.settings.on_unwritable, self.settings.readonly)
        except UnwritableCache:
            raise
        except OSError as err:
            raise KCacheError(
                f"cannot create the cache root {self.settings.root}: {err.strerror or err}. "
                "Set KCACHE_DIR (or pass root=) to a usable directory, or KCACHE_READONLY=1 to only read it."
            ) from err
        # Where this cache writes (the configured root, or a per-user fallback), and where hits come from.
        self.root = plan.write_root or self.settings.root
        self.readonly = plan.write_root is None
        self.read_roots = plan.read_roots
        self._upstream_stores: list[EntryStore] | None = None
        self._noexec: dict[Path, Path | None] = {}  # root -> its noexec mount point, or None
        self._stats = CacheStats()
        self._stats_file = None if self.readonly else stats_file(self.root)
        self.memory: MemoryTier | None = None  # needs TVM: made with the backend
        self._store: EntryStore | None = None
        self._backend: Any = None
        if backend is not None:
            self._use_backend(backend)
        self._key_threads: dict[str, threading.Lock] = {}
        self._key_threads_guard = threading.Lock()
        self._toolchain: dict[str, object] | None = None
        self._pool = compile_pool
        self._remote_tier: RemoteTier | None = None
        self._warned: set[str] = set()
        if not self.readonly:
            self._maybe_gc()
        if self._backend is not None or "tilelang" in sys.modules:
            # TileLang is loaded, so this cache is about to serve it: opening
            # the cache loads the backend and identifies the toolchain (like
            # TileLang's own cache, which does its setup at import). A process
            # that only inspects the cache never imports TileLang.
            self._toolchain = self._tilelang().toolchain_fingerprint(self.root, persist=not self.readonly)

    # ------------------------------------------------------------ public

    def get_or_compile(
        self,
        func: PrimFunc,
        target: str | dict[str, Any] | Any | None = None,
        *,
        out_idx: int | Sequence[int] | None = None,
        pass_configs: dict[str, Any] | None = None,
        compile_flags: str | Sequence[str] | None = None,
        execution_backend: str = "tvm_ffi",
    ) -> JITKernel:
        """A runnable TileLang kernel for `func`, compiled at most once across processes."""
        backend = self._tilelang()
        target_key = backend.target_memo_key(target)
        options = (
            target_key,
            None if out_idx is None else tuple(backend.normalize_out_idx(out_idx)),
            None if not pass_configs else backend.canonical_json(pass_configs),
            None if compile_flags is None else tuple(backend.normalize_flags(compile_flags)),
            execution_backend,
        )
        kernel = self.memory.get(func, options)
        if kernel is not None:
            self._count(memory_hits=1)
            return kernel
        kernel = self._get_slow(backend, func, target, out_idx, pass_configs, compile_flags, execution_backend, target_key)
        return self.memory.put(func, options, kernel)

    def gc(self) -> GcReport:
        """Remove stale staging (everywhere under the root), idle lock files and the trash; fold dead
        processes' stats; evict down to KCACHE_MAX_SIZE and KCACHE_MAX_AGE."""
        report = collect_garbage(self.root, self.settings.staging_ttl_s,
                                 self.settings.max_size_bytes, self.settings.max_age_s)
        if report.evicted:
            self._count(evictions=report.evicted)
        return report

    def stats(self) -> dict[str, float]:
        """This cache's counters in this process: memory_hits, disk_hits, misses, compiles,
        compile_seconds, lost_races, corrupt_entries, publish_failures, evictions, lock_waits,
        lock_wait_seconds. `kcache.maintenance.stats.read_persisted(root)` sums every process's."""
        return self._stats.snapshot()

    def _warn_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning(message, *args)

    def _count(self, **deltas: float) -> None:
        self._stats.add(**deltas)
        if self._stats_file is not None:
            self._stats_file.add(**deltas)

    @property
    def compile_pool(self) -> CompilePool:
        """The worker pool this cache compiles in: the one given, else the process's shared pool."""
        if self._pool is not None:
            return self._pool
        from kcache.compile.pool import shared_pool  # not on the hit path: ~5 ms of imports

        return shared_pool(self.settings.compile_workers, self.settings.compile_timeout_s,
                           self._tilelang().COMPILE_PRELOAD)

    @property
    def store(self) -> EntryStore:
        if self._store is None:
            self._store = EntryStore(self.root, KERNELS, self._tilelang().COMPONENTS)
        return self._store

    # ------------------------------------------------------------ internals

    def _tilelang(self) -> Any:
        backend = self._backend
        if backend is None:
            from kcache.tilelang import backend

            self._use_backend(backend)
        return backend

    def _use_backend(self, backend: Any) -> None:
        self.memory = MemoryTier(backend.fast_structural_hash, backend.fast_structural_equal)
        self._backend = backend

    def _toolchain_fingerprint(self, backend: Any) -> dict[str, object]:
        # One process runs one TileLang: identify its toolchain once per cache.
        if self._toolchain is None:
            self._toolchain = backend.toolchain_fingerprint(self.root, persist=not self.readonly)
        return self._toolchain

    def _get_slow(self, backend: Any, func: Any, target: Any, out_idx: Any, pass_configs: Any, compile_flags: Any,
                  execution_backend: str, target_key: str | None = None) -> Any:
        request = _Request(
            func=func,
            resolved=backend.resolve_target(target, execution_backend, target_key),
            out_idx=backend.normalize_out_idx(out_idx),
            pass_configs=backend.normalize_pass_configs(pass_configs),
            compile_flags=backend.normalize_flags(compile_flags),
            toolchain=self._toolchain_fingerprint(backend),
        )
        request.key = derive_key(backend.key_fields(
            func, request.resolved, request.out_idx, request.pass_configs, request.compile_flags, request.toolchain
        ))
        kernel = self._load_published(backend, request, quarantine=False)
        if kernel is not None:
            self._count(disk_hits=1)
            return kernel
        self._count(misses=1)
        if self.readonly:
            return self._compile_private(backend, request)
        with self._thread_gate(request.key):
            # Another thread of this process may have finished it meanwhile.
            kernel = self._load_published(backend, request, quarantine=False)
            if kernel is not None:
                self._count(disk_hits=1)
                return kernel
            kernel = self._compile_once(backend, request)
        self._maybe_gc()  # the cache grew: evict if it is time to look
        return kernel

    def _compile_once(self, backend: Any, request: _Request) -> Any:
        lock = KeyLock(self.root / layout.LOCKS / f"{request.key}.lock", request.key)
        entry = self.store.entry_path(request.key)
        # Waiters stop waiting as soon as the holder's entry appears and load
        # it without the lock; queueing them through it would serialize N loads.
        give_up_when: Any = entry.is_dir
        while True:
            started = time.monotonic()
            try:
                waited = lock.acquire(self.settings.lock_timeout_s, give_up_when)
            except CacheLockTimeout:
                raise
            except OSError as err:
                if err.errno not in access.UNWRITABLE_ERRNOS:
                    raise
                # The root was writable when this cache opened; it is not now. This call still gets
                # its kernel, compiled without saving it, rather than a PermissionError.
                self._warn_once("lock-denied", "kcache: cannot take the compile lock %s (%s); compiling %s "
                                "without saving it. Check the owner and mode of %s.", lock.path,
                                err.strerror or err, backend.kernel_name(request.func), self.root)
                return self._compile_private(backend, request)
            if waited is None:
                self._count(lock_waits=1, lock_wait_seconds=time.monotonic() - started)
                kernel = self._load_published(backend, request, quarantine=False)
                if kernel is not None:
                    self._count(disk_hits=1)
                    return kernel
                give_up_when = None  # it is corrupt or went away: take the lock to repair it
                continue
            if waited > 0:
                self._count(lock_waits=1, lock_wait_seconds=waited)
            break
        with lock:
            kernel = self._load_published(backend, request, quarantine=True)
            if kernel is not None:
                self._count(disk_hits=1)
                return kernel
            remote = self._remote(backend)
            if remote is None:
                return self._compile(backend, request)
            return self._compile_cluster_once(backend, request, remote)

    def _compile(self, backend: Any, request: _Request) -> Any:
        if self.settings.compile_isolation == "inprocess":
            compiled = backend.compile_kernel(
                request.func, request.resolved, request.out_idx, request.pass_configs,
                request.compile_flags, self.root / layout.LOGS,
            )
            self._count(compiles=1, compile_seconds=getattr(compiled, "seconds", 0.0))
            return self._publish(backend, request, compiled)
        return self._compile_isolated(backend, request)

    # ------------------------------------------------------------ remote tier

    def _remote(self, backend: Any) -> RemoteTier | None:
        if self._remote_tier is None and self.settings.remote_url:
            from kcache.tiers.remote import RemoteTier

            toolchain = self._toolchain_fingerprint(backend)
            namespace = f"e{ENTRY_FORMAT}:t{hashlib.sha256(canonical_json(toolchain).encode()).hexdigest()[:16]}"
            self._remote_tier = RemoteTier(
                self.settings.remote_url, namespace, self.store.required, secret=self.settings.remote_secret,
                ttl_s=self.settings.remote_ttl_s, max_entry_bytes=self.settings.remote_max_entry_bytes,
            )
        return self._remote_tier

    def _compile_cluster_once(self, backend: Any, request: _Request, remote: RemoteTier) -> Any:
        """Under the local lock: a remote hit, or wait for the node holding the remote lease, or compile
        and upload. Redis trouble at any point means: compile locally."""
        delay = 0.005
        deadline = time.monotonic() + self.settings.lock_timeout_s
        while True:
            kernel = self._load_remote(backend, request, remote)
            if kernel is not None:
                return kernel
            lease = remote.try_lease(request.key, self.settings.remote_lease_s)
            if lease is not False or time.monotonic() > deadline:
                break  # ours, or Redis is unavailable, or we waited long enough
            # Another node compiles it: poll until its upload lands or its lease lapses (it died).
            while remote.lease_held(request.key) and time.monotonic() < deadline:
                kernel = self._load_remote(backend, request, remote)
                if kernel is not None:
                    return kernel
                time.sleep(delay)  # polling a remote lease has no event to wait on
                delay = min(delay * 2, 0.25)
        try:
            kernel = self._compile(backend, request)
            self._upload(remote, request.key)
            return kernel
        finally:
            if lease:
                lease.release()

    def _load_remote(self, backend: Any, request: _Request, remote: RemoteTier) -> Any | None:
        files = remote.get(request.key)
        if files is None:
            return None

        def fill(staging: Path) -> None:
            for name, data in files.items():
                if name != MANIFEST_NAME:  # the store writes (and checks) its own
                    write_durable(staging / name, data)

        try:
            self.store.publish(request.key, fill)
        except (KCacheError, OSError) as err:
            log.warning("kcache: could not store the remote entry %s locally: %s", request.key[:16], err)
            return None
        kernel = self._load_published(backend, request, quarantine=True)
        if kernel is not None:
            self._count(remote_hits=1)
        return kernel

    def _upload(self, remote: RemoteTier, key: str) -> None:
        entry = self.store.entry_path(key)
        try:
            files = self.store.read(key)
            manifest = (entry / MANIFEST_NAME).read_bytes()
        except (CorruptEntry, OSError) as err:
            log.debug("kcache: not uploading %s: %s", key[:16], err)
            return
        if files is not None and remote.put(key, {**files, MANIFEST_NAME: manifest}):
            self._count(uploads=1)

    def _compile_isolated(self, backend: Any, request: _Request) -> Any:
        """Compile in the pool: a worker writes the staged entry, this process publishes and loads it."""
        pool = self.compile_pool

        def compile_into(out_dir: Path) -> None:
            backend.compile_entry(
                request.func, request.resolved, request.out_idx, request.pass_configs, request.compile_flags,
                self.root / layout.LOGS, pool=pool, out_dir=out_dir, key=request.key, toolchain=request.toolchain,
            )

        started = time.perf_counter()
        try:
            outcome = self.store.publish(request.key, compile_into)
        except PublishError as err:
            # The cache cannot take the entry (a full disk, say): compile into a
            # private directory and load from there, so the caller still gets
            # its kernel; the cause is not hidden.
            self._count(publish_failures=1)
            log.warning("kcache: could not save %s in the cache, so it will compile again next time: %s",
                        backend.kernel_name(request.func), err)
            kernel = self._compile_unsaved(backend, request, compile_into)
            self._count(compiles=1, compile_seconds=time.perf_counter() - started)
            return kernel
        self._count(compiles=1, compile_seconds=time.perf_counter() - started)
        if outcome is PublishOutcome.LOST_RACE:
            self._count(lost_races=1)
        kernel = self._load_published(backend, request, quarantine=True)
        if kernel is None:
            # What is published there cannot be loaded here (untrusted, say: see the warning): this
            # caller still gets its kernel, compiled privately.
            kernel = self._compile_unsaved(backend, request, compile_into)
        return kernel

    def _compile_private(self, backend: Any, request: _Request) -> Any:
        """KCACHE_READONLY: compile without writing anything under the root (no entry, lock or log)."""
        log_dir = Path(tempfile.gettempdir()) / f"kcache-logs-{os.geteuid()}"
        started = time.perf_counter()
        if self.settings.compile_isolation == "inprocess":
            kernel = backend.compile_kernel(request.func, request.resolved, request.out_idx, request.pass_configs,
                                            request.compile_flags, log_dir).kernel
        else:
            pool = self.compile_pool

            def compile_into(out_dir: Path) -> None:
                backend.compile_entry(
                    request.func, request.resolved, request.out_idx, request.pass_configs, request.compile_flags,
                    log_dir, pool=pool, out_dir=out_dir, key=request.key, toolchain=request.toolchain,
                )

            kernel = self._compile_unsaved(backend, request, compile_into)
        self._count(compiles=1, compile_seconds=time.perf_counter() - started)
        return kernel

    def _compile_unsaved(self, backend: Any, request: _Request, compile_into: Any) -> Any:
        private = Path(tempfile.mkdtemp(prefix="kcache-unsaved-"))
        try:
            compile_into(private)
            files = {name: (private / name).read_bytes() for name in self.store.required}
            # dlopen has mapped the library: the directory can go at once.
            return self._load_verified(backend, request, private, files)
        finally:
            remove_tree(private, "removing the private compile directory")

    def _publish(self, backend: Any, request: _Request, compiled: Any) -> Any:
        def fill(staging: Path) -> None:
            backend.write_entry(staging, compiled, request.key, request.resolved, request.toolchain)

        for _attempt in range(2):
            try:
                outcome = self.store.publish(request.key, fill)
            except (KCacheError, OSError) as err:
                # The kernel compiled fine; only saving it failed. The caller
                # still gets a working kernel, and the cause is not hidden.
                self._count(publish_failures=1)
                log.warning("kcache: compiled %s but could not save it, so it will compile again next time: %s",
                            compiled.name, err)
                return compiled.kernel
            if outcome is PublishOutcome.PUBLISHED:
                return compiled.kernel
            # Lost the race to a writer that did not take our lock (another
            # host on a filesystem without working flock, say): use theirs.
            self._count(lost_races=1)
            theirs = self._load_published(backend, request, quarantine=True)
            if theirs is not None:
                return theirs
        return compiled.kernel

    def _load_published(self, backend: Any, request: _Request, *, quarantine: bool) -> Any | None:
        """Load the verified entry of `request.key` from this cache's root, else from the roots it
        only reads (a shared root it cannot write), or None.

        A corrupt entry is a miss. With `quarantine` (only under the key's lock) one in this cache's
        own root is also moved aside, so that the compile that follows can publish a good one.
        """
        for store in self._read_stores():
            kernel = self._load_entry(store, backend, request, quarantine=quarantine and store is self.store)
            if kernel is not None:
                return kernel
        return None

    def _read_stores(self) -> list[EntryStore]:
        if self._upstream_stores is None:
            self._upstream_stores = [EntryStore(root, KERNELS, self.store.required)
                                     for root in self.read_roots if root != self.root]
        return [self.store, *self._upstream_stores]

    def _load_entry(self, store: EntryStore, backend: Any, request: _Request, *, quarantine: bool) -> Any | None:
        entry_dir = store.entry_path(request.key)
        try:
            files = store.read(request.key)
            if files is None:
                return None
            distrust = untrusted_reason(entry_dir, store.root)
            if distrust:
                # Not the entry's fault, and maybe not ours to fix: never quarantine, never load.
                self._warn_once(f"untrusted:{distrust}", "kcache: not loading %s: %s. Fix the ownership or mode "
                                "(chmod o-w), or point KCACHE_DIR at a root of your own.", entry_dir, distrust)
                return None
            kernel = self._load_verified(backend, request, entry_dir, files)
            if store is self.store and not self.readonly:
                note_use(entry_dir)
            return kernel
        except CorruptEntry as corrupt:
            if quarantine:
                self._count(corrupt_entries=1)
                self.store.quarantine(request.key, corrupt.reason)
            else:
                log.debug("kcache: %s", corrupt)
            return None

    def _load_verified(self, backend: Any, request: _Request, entry_dir: Path, files: dict[str, bytes]) -> Any:
        """Load verified files: in place, or from a copy where the filesystem forbids mapping code.

        Raises CorruptEntry for a library that will not load (a wrong-arch object, a missing symbol),
        and kcache's own errors for what this machine causes (noexec everywhere, a missing
        dependency), which must never get a good, shared entry quarantined.
        """
        mount = self._noexec_mount(entry_dir.parent)
        try:
            return backend.load_kernel(request.func, entry_dir, files, request.resolved, request.out_idx,
                                       request.pass_configs, request.compile_flags, noexec_mount=mount)
        except KCacheError:
            raise
        except Exception as err:  # a verified entry that TileLang cannot load: why decides what to do
            if mount is None and exec_copy.is_mapping_refused(err):
                # statvfs did not say noexec, yet the code may not be mapped (a FUSE mount, a security
                # module): from now on, load this root's kernels from copies.
                self._noexec[entry_dir.parent] = exec_copy.mount_point(entry_dir.parent)
                self._warn_noexec(entry_dir.parent)
                return self._load_verified(backend, request, entry_dir, files)
            if exec_copy.is_dependency_missing(err):
                raise LocalLoadError(str(entry_dir / LIBRARY), str(err)) from err
            raise CorruptEntry(str(entry_dir), f"verified but failed to load: {type(err).__name__}: {err}") from err

    def _noexec_mount(self, directory: Path) -> Path | None:
        if directory not in self._noexec:
            self._noexec[directory] = exec_copy.noexec_mount(directory)
            if self._noexec[directory] is not None:
                self._warn_noexec(directory)
        return self._noexec[directory]

    def _warn_noexec(self, directory: Path) -> None:
        self._warn_once(f"noexec:{directory}", "kcache: %s is on a filesystem that forbids mapping code (noexec "
                        "mount %s): loading its kernels from in-memory copies of their verified files. To load "
                        "them in place, point KCACHE_DIR at a filesystem mounted with exec.",
                        directory, self._noexec[directory])

    @contextlib.contextmanager
    def _thread_gate(self, key: str) -> Iterator[None]:
        """Threads of one process missing the same key queue here, not on the file lock."""
        with self._key_threads_guard:
            gate = self._key_threads.setdefault(key, threading.Lock())
        with gate:
            yield

    def _maybe_gc(self) -> None:
        try:
            if gc_is_due(self.root, self.settings.gc_interval_s):
                report = self.gc()
                if report.staging_removed or report.locks_removed:
                    log.debug("kcache: gc at open removed %s", report)
        except OSError as err:
            log.warning("kcache: gc of %s at open failed (the cache still works): %s", self.root, err)


@dataclass
class _Request:
    """One get_or_compile call's normalized arguments and key."""

    func: Any
    resolved: Any
    out_idx: list[int] | None
    pass_configs: dict[str, Any]
    compile_flags: list[str] | None
    toolchain: dict[str, object]
    key: str = ""
