"""`TRITON_CACHE_MANAGER=kcache.triton:CacheManager`: Triton's cache on kcache's store.

Triton's `compile` asks a manager for a group (`get_group`), and on a miss puts each file of the
compile (`put`) and then the group (`put_group`); its launcher and driver shared objects, and its
autotuner's timings, are single files (`get_file`, `put`). Here:
- a group is published whole, with one rename, once `put_group` names it; until then its files are
  in a directory of this manager's own, whose paths Triton reads back;
- a miss takes the key's lock, so N processes that miss one key compile it once: the others wait
  (at most KCACHE_LOCK_TIMEOUT) and load the winner's group. The lock is released at `put_group`,
  or when Triton drops the manager (a compile that failed);
- a single file is published as an entry of its own at `put`;
- a shared object on a `noexec` root is handed to Triton as a private copy it may load.
Triton's override and dump modes are Triton's own (`FileCacheManager`), as its RemoteCacheManager does.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from triton.runtime.cache import CacheManager as TritonCacheManager
from triton.runtime.cache import FileCacheManager

from kcache.errors import CacheLockTimeout, CompilerCrashed, CompileTimeout
from kcache.store.manifest import is_entry_file_name
from kcache.triton import lone_files
from kcache.triton.counting import Lookup, counted
from kcache.triton.roots import candidates_apart, roots
from kcache.triton.store import GroupStore, as_paths, entry_key, kernel_name

if TYPE_CHECKING:
    from kcache.triton.held import Held

log = logging.getLogger("kcache")


class CacheManager(TritonCacheManager):
    """Triton's `CacheManager` interface (Triton 3.5 and later) on kcache's store."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._triton_own = FileCacheManager(key, override=override, dump=dump) if override or dump else None
        where = roots()
        self._groups = GroupStore(key, candidates_apart(where))
        # A lone file (a driver's or launcher's module, an autotuner's timings) is no candidate: every
        # config of its signature and the winner load it, so it is saved in the root, even during a tune.
        self._lone_files = self._groups if self._groups.where is where else GroupStore(key, where)
        # Where this manager's lookups are counted: the root's stats; none for Helion's candidates, which
        # are its tune's own compiles (in a throwaway directory: kcache.triton.roots.candidates_apart).
        self._counted_in = where.write if self._groups.where is where else None
        self._staged: dict[str, Path] = {}  # file name -> its path in the private directory
        self._in_group = False  # get_group was asked: the puts that follow are the group's
        self._held_now: Held | None = None  # made at its first use, a miss's: a hit holds nothing

    @property
    def _held(self) -> Held:
        """What this manager holds until Triton drops it (kcache.triton.held)."""
        if self._held_now is None:
            from kcache.triton.held import Held  # a miss's: not loaded by a fresh process's hit

            self._held_now = Held()
            weakref.finalize(self, self._held_now.release)  # when Triton drops the manager
        return self._held_now

    # ------------------------------------------------------------------ reads

    def get_group(self, filename: str) -> dict[str, str] | None:
        if self._triton_own is not None:
            return self._triton_own.get_group(filename)
        self._in_group = True
        lookup = Lookup()  # how this lookup was served: counted and logged as it ends, whichever way
        try:
            found = lookup.found = self._groups.find(self._groups.key, filename)
            frame = None
            if found is None:
                from kcache.triton import isolation, parallel_tune  # a miss's
                from kcache.triton.compile_record import compile_frame

                frame = compile_frame() if isolation.lane() == "worker" else None  # Triton's compile asking
                if frame is not None and parallel_tune.compile_tune_ahead(frame):  # a tune's configs, at once
                    found = lookup.found = self._groups.find(self._groups.key, filename)
                    lookup.how = "disk, its tune's configs compiled ahead"
            if found is None and self._groups.where.write is not None:
                found = lookup.found = self._wait_or_hold(filename, lookup)
            recording = _recorder()  # KCACHE_RECORD: the keys a deployment needs, Triton's too
            if recording is not None:
                recording.note(self._groups.key, kernel_name(filename), "triton")
            if found is None:  # a compile now: KCACHE_JIT_GUARD's warning, or UnexpectedCompile
                from kcache.cache import deployment

                try:
                    deployment.check_compile(kernel_name(filename), self._groups.key,
                                             lambda: f"no Triton entry of that key in {_listed(self._groups.where.reads)}")
                except BaseException:
                    self._held.release_lock()
                    raise
            if found is None and frame is not None:  # compiled away from this process, then read as a hit
                found = lookup.found = self._compile_isolated(frame, filename, lookup)
            return found
        finally:
            lookup.count(self._counted_in, filename, self._groups.key)

    def get_file(self, filename: str) -> str | None:
        if self._triton_own is not None:
            return self._triton_own.get_file(filename)
        if filename in self._staged:
            return str(self._staged[filename])
        lone = lone_files.find(self._lone_files, self._groups, filename, lambda: self._held)
        if lone is None:
            from kcache.triton.isolation import warm_service_soon  # a miss's

            warm_service_soon()  # Triton builds a module now: its compiles are near
            return None
        # Triton loads it by this path later: a private copy of the bytes just verified, never the entry
        return _private_copy(lone[0].name, filename, lone[1][filename])

    # ------------------------------------------------------------------ writes

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str:
        if self._triton_own is not None:
            return self._triton_own.put(data, filename, binary)
        payload = data if isinstance(data, bytes) else str(data).encode()
        if not is_entry_file_name(filename):
            raise ValueError(f"kcache: Triton's file name {filename!r} cannot name an entry's file")
        if not self._in_group:  # a lone file: saved for the next process, and Triton loads its own build
            key = entry_key(self.key, filename)
            self._lone_files.publish(key, None, {filename: payload})
            if self._held_now is not None:
                self._held_now.release_lock()  # a C module built here: the processes waiting read it now
            copy = _private_copy(key, filename, payload)
            self._staged[filename] = Path(copy)
            return copy
        path = self._held.write_private(filename, payload, self._groups.where)
        self._staged[filename] = path
        return str(path)

    def put_group(self, filename: str, group: dict[str, str]) -> str | None:
        if self._triton_own is not None:
            return self._triton_own.put_group(filename, group)
        try:
            files = {name: self._held.read_private(name) if str(self._staged.get(name)) == path
                     else Path(path).read_bytes() for name, path in group.items()}
            from kcache.triton.compile_record import record_of_caller  # a miss's, as put_group

            record = record_of_caller()
            published = self._groups.publish(self._groups.key, filename, files, record)
        finally:
            self._held.release_lock()
        self._log_compile(filename, files, record)
        counted(self._counted_in, "compile", filename, self._groups.key)  # Triton compiled this group here
        return None if published is None else str(published / filename)

    def _log_compile(self, filename: str, files: dict[str, bytes], record: dict[str, Any] | None) -> None:
        """Log this compile as a miss, with what its files and its compile tell of its key (`kcache why-miss`)."""
        from kcache.triton.key_fields import key_fields  # a miss's: a hit loads none of it

        fields = key_fields(filename, files, record)
        if fields is not None and self._groups.where.write is not None:
            from kcache.cache import miss_explain

            miss_explain.log_miss(self._groups.where.write, self._groups.key, kernel_name(filename), fields)

    # ------------------------------------------------------------------ isolation

    def _compile_isolated(self, frame: FrameType, filename: str, lookup: Lookup) -> dict[str, str] | None:
        """The compile that asked, its back half in a worker (kcache.triton.isolation), published here
        (under the key's lock and lease this process holds) and returned as a hit; None where this
        process compiles it itself (and, where a Python error failed it, raises that error). Raises
        TritonCompilerCrashed, TritonCompileTimeout, or in a tune's compile-ahead LeftToItsBenchmark."""
        from kcache.triton import crashes, failed_compiles, isolation
        from kcache.triton.compile_record import record_of
        from kcache.triton.errors import TritonCompilerCrashed, TritonCompileTimeout

        name = isolation.describe(frame, kernel_name(filename))
        try:  # checked under the key's lock: a compile this process waited for may have crashed meanwhile
            crashes.raise_remembered(self._groups, name)
        except BaseException:
            self._held.release_lock()
            raise
        try:
            if failed_compiles.failed_before(self._groups.key):
                raise isolation.CompileFailed(name)
            files = isolation.compile_isolated(frame, name)
        except isolation.CompileFailed:  # Triton's compile raises it here; nothing to wait for (failed_compiles)
            self._held.release_lock()
            failed_compiles.note(self._groups.key)
            failed_compiles.raise_in_ahead_lane(name)
            return None
        except CompileTimeout as err:
            self._held.release_lock()
            log.warning("kcache: Triton's compile of %s outlived KCACHE_COMPILE_TIMEOUT (%g s): its worker was "
                        "killed, this process lives", name, err.timeout)
            raise TritonCompileTimeout(name, err.timeout) from None
        except CompilerCrashed as err:
            crash = TritonCompilerCrashed(name, err.signal_name, err.exit_code, err.stderr_tail)
            remembered = crashes.remember(self._groups, crash)
            self._held.release_lock()
            log.warning("kcache: Triton's compile of %s: its worker %s; this process lives, and an autotuner "
                        "skips this config%s. Its last output: %s", name, crashes.how_it_died(err),
                        "; remembered (`kcache clear --crashes` forgets it)" if remembered else "",
                        isolation.compiler_said(err.stderr_tail))
            raise crash from None
        except BaseException:  # an interrupt, say: the lock is not kept for a compile that will not come
            self._held.release_lock()
            raise
        if files is None:
            return None
        record = record_of(frame)
        try:
            published = self._groups.publish(self._groups.key, filename, files, record)
        finally:
            self._held.release_lock()
        self._log_compile(filename, files, record)
        lookup.compiled_isolated = True
        if published is not None:  # just verified: ours, or a race's winner checked by `publish`
            return {file: str(published / file) for file in files}
        # Nothing published (a read-only root, a full disk): private copies
        return {file: str(self._held.write_private(file, data, self._groups.where)) for file, data in files.items()}

    # ------------------------------------------------------------------ the key's lock

    def _wait_or_hold(self, filename: str, lookup: Lookup) -> dict[str, str] | None:
        """A miss: wait for another process's compile of the key, or hold its lock and compile."""
        lock = self._groups.lock(self._groups.key)
        entry_seen = (lambda: self._groups.find(self._groups.key, filename) is not None)
        deadline = time.monotonic() + self._groups.where.lock_timeout_s  # the local wait and the remote one
        try:
            started = time.monotonic()
            with self._groups.arrivals(self._groups.key) as arrivals:  # a waiter wakes at the publish
                waited = lock.acquire(self._groups.where.lock_timeout_s, entry_seen, arrivals.nap)
            if waited is None or waited > 0:
                lookup.how = "disk, another process's compile"
                counted(None, "wait", filename, self._groups.key,
                         f": {time.monotonic() - started:.1f} s for another process's compile")
        except CacheLockTimeout:
            log.warning("kcache: another process held the compile lock of Triton's %s for KCACHE_LOCK_TIMEOUT "
                        "(%.0f s); compiling it here too", filename, self._groups.where.lock_timeout_s)
            return None
        except OSError as err:
            log.warning("kcache: cannot take the compile lock %s (%s); compiling Triton's %s without it",
                        lock.path, err.strerror or err, filename)
            return None
        if waited is None:  # the holder published it
            return self._groups.find(self._groups.key, filename)
        found = self._groups.find(self._groups.key, filename, locked=True)  # published just before we locked
        if found is None and self._groups.where.remote is not None:
            found = self._claim_cluster_wide(filename, max(0.0, deadline - time.monotonic()))
            lookup.how = "remote"
        if found is not None:
            lock.release()
            return found
        self._held.lock = lock
        return None

    def _claim_cluster_wide(self, filename: str, timeout_s: float) -> dict[str, str] | None:
        """Under the key's lock, with remote tiers: another node's group, or this node's lease to compile
        it (held until `put_group`); another node's lease is waited for, backing off, at most what is
        left of KCACHE_LOCK_TIMEOUT."""
        key = self._groups.key
        claim = self._groups.where.remote.claim(key, self._groups.where.lease_s, timeout_s,
                                                lambda: as_paths(self._groups.fetch(key, filename, locked=True)))
        if claim.timed_out:
            log.warning("kcache: another node held the compile lease of Triton's %s (key %s) for KCACHE_LOCK_TIMEOUT "
                        "without uploading it; compiling it here too", filename, key[:16])
        self._held.lease = claim.lease
        return claim.found


def _recorder() -> Any:
    """The key recorder (KCACHE_RECORD, or kcache.record()), loading its module only where one can be
    set: a hit without them loads nothing of the deployment's."""
    if "kcache.cache.deployment" not in sys.modules and not os.environ.get("KCACHE_RECORD"):
        return None
    from kcache.cache import deployment

    return deployment.recorder()


def _private_copy(entry: str, name: str, data: bytes) -> str:
    """kcache.triton.private's answer, loaded where a lone file is asked for or put (Triton's
    launcher and driver modules): a compile's hit loads neither it nor its noexec checks."""
    from kcache.triton.private import private_copy

    return private_copy(entry, name, data)


def _listed(roots: tuple[Path, ...]) -> str:
    return ", ".join(str(root) for root in roots) or "no root"
