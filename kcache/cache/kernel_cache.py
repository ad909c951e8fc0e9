"""`KernelCache`: the one public facade over the tiers, the store and the compile path.

A lookup is a short pipeline, each step in the layer that owns it:

    memory (kcache.tiers.memory) -> disk (kcache.tiers.disk) -> [a miss, under the key's lock:
    kcache.cache.single_flight] disk again -> remote (kcache.tiers.remote) -> compile and
    publish (kcache.cache.compiling, kcache.store.entries)

The miss path (kcache.cache.miss_path) is loaded on the first miss, and the compile service's
warm-up (kcache.cache.service_warmup) only to warm the service up: a process that only hits never
imports either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kcache import lookup_log
from kcache.cache import deployment
from kcache.cache.request import KernelRequest
from kcache.config import Settings, warn_unknown_settings
from kcache.errors import KCacheError, UnwritableCache
from kcache.keys import ENTRY_FORMAT, canonical_json
from kcache.maintenance.counter_file import stats_file
from kcache.maintenance.gc_stamp import collect_if_due
from kcache.maintenance.stats import CacheStats
from kcache.setting_values import jit_guard_setting, remote_urls
from kcache.store import access
from kcache.store.components import KERNELS
from kcache.store.entries import EntryStore
from kcache.tiers.disk import DiskTier
from kcache.tiers.memory import MemoryTier
from kcache.tilelang import support
from kcache.tilelang.installed import tilelang_installed

if TYPE_CHECKING:
    from tilelang.jit import JITKernel
    from tvm.tirx import PrimFunc

    from kcache.cache.miss_path import MissPath
    from kcache.compile.pool.process_pool import CompilePool
    from kcache.maintenance.gc import GcReport
    from kcache.tiers.remote_chain import RemoteTiers

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
        warn_unknown_settings()  # a misspelt setting would otherwise do nothing, silently
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
        self._stats = CacheStats()
        self._stats_file = None if self.readonly else stats_file(self.root)
        # The tiers and steps that need the backend (TVM for the memory tier, its components for
        # the store) are made with it.
        self.memory: MemoryTier | None = None
        self._store: EntryStore | None = None
        self._disk: DiskTier | None = None
        self._misses: MissPath | None = None
        self._backend: Any = None
        if backend is not None:
            self._use_backend(backend)
        self._toolchain: dict[str, object] | None = None
        self._pool = compile_pool
        self._serves_through_service = False  # compiles go to the shared compile service
        self._remote_tier: RemoteTiers | None = None
        self._warned: set[str] = set()
        if not self.readonly:
            self._maybe_gc()
        if self._backend is not None or ("tilelang" in sys.modules and support.unsupported_reason() is None):
            # TileLang is loaded, so this cache is about to serve it: opening
            # the cache loads the backend and identifies the toolchain (like
            # TileLang's own cache, which does its setup at import). A process
            # that only inspects the cache never imports TileLang; with a TileLang
            # kcache does not support, the cache opens and its compiles refuse.
            self._toolchain = self._tilelang().toolchain_fingerprint(self.root, persist=not self.readonly)
        if self.settings.compile_isolation == "server" and not self.readonly and backend is None and compile_pool is None:
            self._serves_through_service = True
            if "tilelang" not in sys.modules and _compiles_expected() and tilelang_installed():
                # Opened before the program imports TileLang (kcache.install() at the top, say): the
                # service's start overlaps that import. Opened after it, a process that only hits (a
                # server loading its kernels) would start a compile service for nothing and load its
                # client on the hit path: its first miss starts it instead. A process that declares
                # it compiles nothing (KCACHE_JIT_GUARD=error) starts none either way; nor does one
                # where TileLang is not installed: no compile could run there.
                self.warm_compiles(1)

    def warm_compiles(self, count: int = 1) -> None:
        """In server mode, reach (or start) the compile service in the background and ask it for
        `count` warm workers: a cold machine's first compile then overlaps what the program does next
        (its own `import tilelang`, when the cache opens first; a tuner's building of its configs)
        instead of following it. Never blocks, never raises; nothing in the other modes."""
        if not self._serves_through_service:
            return
        # Loaded here, not at the top: it loads the compile service's client, which a hit never needs.
        from kcache.cache.service_warmup import warm_in_background

        identify_in = None if self.readonly or self._toolchain is not None else str(self.root)
        warm_in_background(self.settings, count, identify_in)

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
            backend.context_token(),  # the environment and callbacks the compile depends on
        )
        memory = self.memory
        assert memory is not None  # made with the backend
        kernel = memory.get(func, options)
        if kernel is not None:
            self._count(memory_hits=1)
            if lookup_log.enabled("hit"):  # the kernel's name costs a little: only where it is logged
                lookup_log.lookup("tilelang", "hit", backend.kernel_name(func), "-", " (memory)")
            return kernel
        request = KernelRequest.build(backend, func, target, out_idx, pass_configs, compile_flags, execution_backend,
                                      target_key, self._toolchain_fingerprint(backend))
        recorder = deployment.recorder()
        if recorder is not None:  # KCACHE_RECORD: every key asked for (a memory hit was a miss here first)
            recorder.note(request.key, backend.kernel_name(func), request.resolved.canonical, request.described(backend))
        return memory.put(func, options, self._get_slow(backend, request))

    def gc(self) -> GcReport:
        """Remove stale staging (everywhere under the root), idle lock files and the trash; fold dead
        processes' stats; evict down to KCACHE_MAX_SIZE and KCACHE_MAX_AGE."""
        from kcache.maintenance.gc import collect_garbage  # loaded when a gc runs: a hit never needs it

        report = collect_garbage(self.root, self.settings.staging_ttl_s,
                                 self.settings.max_size_bytes, self.settings.max_age_s)
        if report.evicted:
            self._count(evictions=report.evicted)
        return report

    def share(self, key: str) -> bool:
        """Upload the local entry `key` to the remote tier (KCACHE_REMOTE): what a tune does with its
        best kernel, which may have been compiled before the remote tier was set. False without a
        remote, without the entry, or when Redis is unavailable."""
        backend = self._tilelang()
        remote = self._remote(backend) if not self.readonly else None
        if remote is None:
            return False
        return self._miss_path(backend).flight.upload(remote, key)

    def stats(self) -> dict[str, float]:
        """This cache's counters in this process: memory_hits, disk_hits, misses, compiles,
        compile_seconds, lost_races, corrupt_entries, publish_failures, evictions, lock_waits,
        lock_wait_seconds. `kcache.maintenance.stats.read_persisted(root)` sums every process's."""
        return self._stats.snapshot()

    @property
    def compile_pool(self) -> CompilePool:
        """The worker pool this cache compiles in: the one given, else (KCACHE_COMPILE_ISOLATION=server)
        this user's compile service, else the process's shared pool."""
        if self._pool is not None:
            return self._pool
        from kcache.cache.miss_path import compile_pool_for  # the miss path: not on the hit path

        return compile_pool_for(self.settings, self._tilelang().COMPILE_PRELOAD)

    @property
    def store(self) -> EntryStore:
        if self._store is None:
            self._store = EntryStore(self.root, KERNELS, self._tilelang().COMPONENTS, bind_key=True)
        return self._store

    # ------------------------------------------------------------ the pipeline

    def _get_slow(self, backend: Any, request: KernelRequest) -> Any:
        """disk -> [lock -> disk -> remote -> compile -> publish]."""
        disk = self._disk_tier()
        kernel = disk.load(request.key, request.loader(backend), quarantine=False)
        if kernel is not None:
            self._disk_hit(backend, request, "")
            return kernel
        return self._miss_path(backend).get(request)

    def _disk_hit(self, backend: Any, request: KernelRequest, how: str) -> None:
        self._count(disk_hits=1)
        lookup_log.lookup("tilelang", "hit", backend.kernel_name(request.func), request.key, f" (disk{how})")

    def _disk_tier(self) -> DiskTier:
        if self._disk is None:
            self._disk = DiskTier(self.store, list(self.read_roots), readonly=self.readonly, count=self._count,
                                  warn_once=self._warn_once)
        return self._disk

    def _miss_path(self, backend: Any) -> MissPath:
        if self._misses is None:
            from kcache.cache.miss_path import MissPath  # the miss path: loaded on the first miss

            self._misses = MissPath(
                backend, self._disk_tier(), self.settings, readonly=self.readonly, pool=lambda: self.compile_pool,
                remote=lambda: self._remote(backend), count=self._count, warn_once=self._warn_once,
                disk_hit=lambda request, how: self._disk_hit(backend, request, how), grown=self._maybe_gc,
            )
        return self._misses

    def _remote(self, backend: Any) -> RemoteTiers | None:
        if self._remote_tier is None:
            self._remote_tier = self.remote_tier_for(f"e{ENTRY_FORMAT}", self.store.required, backend)
        return self._remote_tier

    def remote_tier_for(self, kind: str, required: frozenset[str], backend: Any = None) -> RemoteTiers | None:
        """This cache's remote tier (KCACHE_REMOTE) for values of `kind` made of the files `required`,
        in a namespace of this toolchain's; None without a remote. Autotune results use it beside
        kernel entries."""
        urls = remote_urls(self.settings.remote_url)
        if not urls:
            return None
        from kcache.tiers.remote_chain import open_remote_tiers

        toolchain = self._toolchain_fingerprint(backend if backend is not None else self._tilelang())
        namespace = f"{kind}:t{hashlib.sha256(canonical_json(toolchain).encode()).hexdigest()[:16]}"
        return open_remote_tiers(urls, namespace, required, self.settings)

    # ------------------------------------------------------------ internals

    def _tilelang(self) -> Any:
        backend = self._backend
        if backend is None:
            backend = support.load_backend()  # one line where TileLang is missing or unsupported
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

    def _warn_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning(message, *args)

    def _count(self, **deltas: float) -> None:
        self._stats.add(**deltas)
        if self._stats_file is not None:
            self._stats_file.add(**deltas)

    def _maybe_gc(self) -> None:
        collect_if_due(self.root, self.settings.gc_interval_s, self.gc)


def _compiles_expected() -> bool:
    """False where the program declared it compiles nothing (KCACHE_JIT_GUARD=error; a bad value
    failed already, when the settings were checked at open)."""
    return jit_guard_setting() != "error"
