"""The local disk tier: verified entries in this cache's root, then in the roots it only reads.

An entry is loaded only after the trust check (on every descriptor from the
root down, kcache/store/trust.py), its manifest and its key binding pass. A corrupt entry is a miss; under the key's lock (`quarantine=True`)
one in this cache's own root is also moved aside so that the compile that
follows can publish a good one. An untrusted entry is never loaded and
never quarantined: it is not the entry's fault, and maybe not ours to fix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.errors import CorruptEntry, KCacheError, LocalLoadError, PublishError, UntrustedEntry
from kcache.store import exec_copy
from kcache.store.components import KERNELS, LIBRARY
from kcache.store.entries import EntryStore
from kcache.store.last_use import note_use

log = logging.getLogger("kcache")

# Builds a runnable kernel from an entry directory, its verified files and the noexec mount point
# (None where code may be mapped in place): the backend's load_kernel with the request's arguments.
Loader = Callable[[Path, dict[str, bytes], "Path | None"], Any]


class DiskTier:
    """Reads of verified entries. `count` and `warn_once` report to the owning cache."""

    def __init__(self, store: EntryStore, read_roots: list[Path], *, readonly: bool,
                 count: Callable[..., None], warn_once: Callable[..., None]) -> None:
        self.store = store
        self._upstream = [EntryStore(root, KERNELS, store.required, bind_key=True) for root in read_roots if root != store.root]
        self._readonly = readonly
        self._count = count
        self._warn_once = warn_once
        self._noexec: dict[Path, Path | None] = {}  # root -> its noexec mount point, or None

    def load(self, key: str, loader: Loader, *, quarantine: bool) -> Any | None:
        """The kernel of `key` from this cache's root, else from the roots it only reads, or None."""
        for store in (self.store, *self._upstream):
            kernel = self._load_entry(store, key, loader, quarantine=quarantine and store is self.store)
            if kernel is not None:
                return kernel
        return None

    def _load_entry(self, store: EntryStore, key: str, loader: Loader, *, quarantine: bool) -> Any | None:
        entry_dir = store.entry_path(key)
        try:
            # Trust is checked on each descriptor from the root down before a byte is read, and the
            # library is loaded from a copy of the bytes verified here: a swap after the check loads
            # nothing new.
            files = store.read(key)
            if files is None:
                return None
            kernel = self.load_verified(entry_dir, files, loader)
            if store is self.store and not self._readonly:
                note_use(entry_dir)
            return kernel
        except UntrustedEntry as untrusted:
            # Not the entry's fault, and maybe not ours to fix: never quarantined, never loaded.
            self._warn_once(f"untrusted:{untrusted.reason}", "kcache: %s", untrusted)
            return None
        except CorruptEntry as corrupt:
            if quarantine:
                self._count(corrupt_entries=1)
                try:
                    self.store.quarantine(key, corrupt.reason)
                except PublishError as err:  # it stays, and the caller gets a kernel compiled privately
                    self._warn_once(f"quarantine:{err.errno}", "kcache: %s", err)
            else:
                log.debug("kcache: %s", corrupt)
            return None

    def load_verified(self, entry_dir: Path, files: dict[str, bytes], loader: Loader) -> Any:
        """Load verified files: in place, or from a copy where the filesystem forbids mapping code.

        Raises CorruptEntry for a library that will not load (cut short or another machine's: the
        loader checks its structure before dlopen, store/elf.py; a missing symbol),
        and kcache's own errors for what this machine causes (noexec everywhere, a missing
        dependency), which must never get a good, shared entry quarantined.
        """
        mount = self._noexec_mount(entry_dir.parent)
        try:
            return loader(entry_dir, files, mount)
        except KCacheError:
            raise
        except Exception as err:  # a verified entry that TileLang cannot load: why decides what to do
            if mount is None and exec_copy.is_mapping_refused(err):
                # statvfs did not say noexec, yet the code may not be mapped (a FUSE mount, a security
                # module): from now on, load this root's kernels from copies.
                self._noexec[entry_dir.parent] = exec_copy.mount_point(entry_dir.parent)
                self._warn_noexec(entry_dir.parent)
                return self.load_verified(entry_dir, files, loader)
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
