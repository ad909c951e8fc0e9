"""The compile and publish steps of a miss: compile (in the pool or in process), publish, load.

Whatever fails after a good compile (a full disk, a root that turned
read-only, an entry this process may not load) costs the cache entry, never
the kernel: the caller gets a kernel compiled into a private directory, and
one warning says why it was not saved.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache import lookup_log
from kcache.cache import deployment, miss_explain
from kcache.cache.request import KernelRequest
from kcache.errors import KCacheError, PublishError
from kcache.store import access, layout
from kcache.store.entries import PublishOutcome
from kcache.store.fsutil import remove_tree
from kcache.tiers.disk import DiskTier

log = logging.getLogger("kcache")


class CompileStep:
    """Compiles requests of one cache with its backend, and publishes them into its store."""

    def __init__(self, backend: Any, disk: DiskTier, *, isolation: str, pool: Callable[[], Any],
                 count: Callable[..., None]) -> None:
        self._backend = backend
        self._disk = disk
        self._store = disk.store
        self._isolation = isolation
        self._pool = pool  # the compile pool, made on first use: its imports are not on the hit path
        self._count = count

    def compile_and_publish(self, request: KernelRequest) -> Any:
        """Compile `request`, publish its entry, return its kernel (under the key's lock)."""
        self._count_miss(request)
        self._before_compile(request)
        if self._isolation == "inprocess":
            compiled = self._backend.compile_kernel(
                request.func, request.resolved, request.out_idx, request.pass_configs,
                request.compile_flags, self._store.root / layout.LOGS, request.context,
            )
            self._compiled(request, getattr(compiled, "seconds", 0.0))
            return self._publish(request, compiled)
        return self._compile_isolated(request)

    def _count_miss(self, request: KernelRequest) -> None:
        """A miss is a lookup that compiles, counted before the compile (one that fails, or that the JIT
        guard refuses, was a miss too); whoever waited for it counts a hit."""
        self._count(misses=1)
        lookup_log.lookup("tilelang", "miss", self._backend.kernel_name(request.func), request.key, ": compiling")

    def _compiled(self, request: KernelRequest, seconds: float) -> None:
        self._count(compiles=1, compile_seconds=seconds)
        lookup_log.lookup("tilelang", "compile", self._backend.kernel_name(request.func), request.key,
                          f": {seconds:.1f} s")

    def _before_compile(self, request: KernelRequest) -> None:
        """Log the miss (`kcache why-miss`), then let the JIT guard speak: it may refuse the compile."""
        kernel = self._backend.kernel_name(request.func)
        miss_explain.log_miss(self._store.root, request.key, kernel, request.described(self._backend),
                              refused=deployment.guard_mode() == "error")
        deployment.check_compile(kernel, request.key, self._explainer(request, kernel))

    def _explainer(self, request: KernelRequest, kernel: str) -> Callable[[], str]:
        def why() -> str:
            return miss_explain.explain(self._store.root, request.key, kernel, request.described(self._backend)).summary()

        return why

    def compile_private(self, request: KernelRequest, *, in_process: bool = False) -> Any:
        """Compile without writing anything under the root (no entry, lock or log): KCACHE_READONLY,
        and compiles whose context cannot be keyed (`in_process`: nor sent to a worker)."""
        self._count_miss(request)
        deployment.check_compile(self._backend.kernel_name(request.func), request.key)
        log_dir = access.private_root() / "logs"  # never a predictable name in a shared tmp
        started = time.perf_counter()
        if in_process or self._isolation == "inprocess":
            kernel = self._backend.compile_kernel(request.func, request.resolved, request.out_idx,
                                                  request.pass_configs, request.compile_flags, log_dir,
                                                  request.context).kernel
        else:
            kernel = self.compile_unsaved(request, self._compile_into(request, log_dir))
        self._compiled(request, time.perf_counter() - started)
        return kernel

    def compile_unsaved(self, request: KernelRequest, compile_into: Callable[[Path], None]) -> Any:
        """Compile into a private directory and load from there; nothing stays behind."""
        private = Path(tempfile.mkdtemp(prefix="kcache-unsaved-"))
        try:
            compile_into(private)
            files = {name: (private / name).read_bytes() for name in self._store.required}
            # dlopen has mapped the library: the directory can go at once.
            return self._disk.load_verified(private, files, request.loader(self._backend))
        finally:
            remove_tree(private, "removing the private compile directory")

    def _compile_into(self, request: KernelRequest, log_dir: Path) -> Callable[[Path], None]:
        pool = self._pool()

        def compile_into(out_dir: Path) -> None:
            self._backend.compile_entry(
                request.func, request.resolved, request.out_idx, request.pass_configs, request.compile_flags,
                log_dir, pool=pool, out_dir=out_dir, key=request.key, toolchain=request.toolchain,
                context=request.context, described_fields=request.entry_fields(self._backend),
            )

        return compile_into

    def _compile_isolated(self, request: KernelRequest) -> Any:
        """Compile in the pool: a worker writes the staged entry, this process publishes and loads it."""
        compile_into = self._compile_into(request, self._store.root / layout.LOGS)
        started = time.perf_counter()
        try:
            outcome = self._store.publish(request.key, compile_into)
        except PublishError as err:
            # The cache cannot take the entry (a full disk, say): compile into a
            # private directory and load from there, so the caller still gets
            # its kernel; the cause is not hidden.
            self._count(publish_failures=1)
            log.warning("kcache: could not save %s in the cache, so it will compile again next time: %s",
                        self._backend.kernel_name(request.func), err)
            kernel = self.compile_unsaved(request, compile_into)
            self._compiled(request, time.perf_counter() - started)
            return kernel
        self._compiled(request, time.perf_counter() - started)
        if outcome is PublishOutcome.LOST_RACE:
            self._count(lost_races=1)
        kernel = self._disk.load(request.key, request.loader(self._backend), quarantine=True)
        if kernel is None:
            # What is published there cannot be loaded here (untrusted, say: see the warning): this
            # caller still gets its kernel, compiled privately.
            kernel = self.compile_unsaved(request, compile_into)
        return kernel

    def _publish(self, request: KernelRequest, compiled: Any) -> Any:
        def fill(staging: Path) -> None:
            self._backend.write_entry(staging, compiled, request.key, request.resolved, request.toolchain,
                                      request.entry_fields(self._backend))

        for _attempt in range(2):
            try:
                outcome = self._store.publish(request.key, fill)
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
            theirs = self._disk.load(request.key, request.loader(self._backend), quarantine=True)
            if theirs is not None:
                return theirs
        return compiled.kernel
