"""Triton's cache groups as kcache entries: `<root>/triton/<key>/`, published whole with one rename.

Triton names a cache directory by a key (base32 of a sha256) and puts files into it one by one; a
compile's files form a group. Here a group is one entry of kcache's store (`EntryStore`: staged,
manifest of sizes and sha256, fsynced, one rename), named by the key's sha256 in hex, with a
`kcache-triton.json` that names the key and the group. A file put outside a group (the launcher's
and the driver's shared objects, the autotuner's timings) is an entry of its own, named by the key
and the file's name. A reader verifies the whole entry before it sees a path, so it never combines
two writers' files; a corrupt entry is moved aside and compiled again.

This module knows nothing of Triton's classes (kcache.triton.manager adapts them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache.errors import CacheLockTimeout, CorruptEntry, UntrustedEntry
from kcache.store import layout
from kcache.store.last_use import note_use
from kcache.store.manifest import MANIFEST_NAME, read_verified
from kcache.triton.roots import META, NAMESPACE, TritonRoots

if TYPE_CHECKING:
    from kcache.store.arrivals import Arrivals
    from kcache.store.entries import EntryStore
    from kcache.store.locks import KeyLock

log = logging.getLogger("kcache")

KERNEL_SUFFIX = " (Triton)"  # a Triton kernel's name, among TileLang's: `add_kernel (Triton)`


def entry_key(triton_key: str, lone_file: str | None = None) -> str:
    """The entry's name: the sha256 Triton's key encodes (base32), in hex; for a file outside a group,
    the sha256 of that and the file's name. A key that is not such an encoding is hashed."""
    try:
        raw = base64.b32decode(triton_key + "=" * (-len(triton_key) % 8))
        key = raw.hex() if len(raw) == 32 else hashlib.sha256(triton_key.encode()).hexdigest()
    except (binascii.Error, ValueError):
        key = hashlib.sha256(triton_key.encode()).hexdigest()
    return key if lone_file is None else hashlib.sha256(f"{key}/{lone_file}".encode()).hexdigest()


def kernel_name(group: str) -> str:
    """How kcache names a Triton kernel (records, the JIT guard, bundles, why-miss): `add_kernel (Triton)`
    for the group `add_kernel.json` (a single file: its name, `cuda_utils (Triton)`)."""
    return f"{group.rsplit('.', 1)[0]}{KERNEL_SUFFIX}"


def bound_meta(files: dict[str, bytes], key: str) -> dict[str, Any] | str:
    """An entry's kcache-triton.json where it names `key` and exactly the entry's files (a manifest
    among `files` aside), else why not: an entry copied from another key, or another writer's file
    set. Triton takes the first `.json` of a group as its metadata, so an extra file is refused too."""
    try:
        meta = json.loads(files[META])
    except (KeyError, ValueError):
        return f"{META} is missing or not JSON"
    if not isinstance(meta, dict) or meta.get("key") != key:
        return f"{META} names another key: an entry copied from another key"
    listed = meta.get("files")
    if (not isinstance(listed, list) or not all(isinstance(name, str) for name in listed)
            or set(files) - {META, MANIFEST_NAME} != set(listed)):
        return f"its files are not the ones {META} lists"
    return meta


_REQUIRED = frozenset({META})


def store_of(root: Path) -> EntryStore:
    """The store of Triton's entries under `root`: for writes, refusals and tiers. Its reads check
    trust from `root` down, as TileLang's do. A hit reads through `read_entry` and so never loads the
    store's write path (kcache.store.entries, fsutil)."""
    from kcache.store.entries import EntryStore

    return EntryStore(root / NAMESPACE, "", _REQUIRED, trust_root=root)


def entry_dir(root: Path, key: str) -> Path:
    """The directory of the entry `key` under `root`: `store_of(root).entry_path(key)`."""
    return root / NAMESPACE / layout.check_key(key)


def read_entry(root: Path, key: str) -> dict[str, bytes] | None:
    """`store_of(root).read(key)`: the entry's files, verified whole (trust checked on every
    descriptor from the cache root down, every size and sha256 against the manifest), or None on a
    miss. Raises CorruptEntry or UntrustedEntry, as the store's read does (tests/test_triton.py)."""
    return read_verified(entry_dir(root, key), _REQUIRED, trust_root=root)


class GroupStore:
    """The entries of one Triton key over the process's roots."""

    def __init__(self, triton_key: str, where: TritonRoots) -> None:
        self.triton_key = triton_key
        self.where = where
        self.key = entry_key(triton_key)
        self._refused_fetches: set[str] = set()  # keys whose remote entry was refused: not fetched again

    # ------------------------------------------------------------------ reads

    def find(self, key: str, group: str | None, file_name: str | None = None, *,
             locked: bool = False) -> dict[str, str] | None:
        """{file name: path} of the verified entry `key` in the first root that has it (the group's
        files, or the lone file), or None: `read`'s entry, as paths into it. The paths are strings,
        as Triton takes them (a Path per file, then its str, cost 6% of a small group's hit)."""
        return as_paths(self.read(key, group, file_name, locked=locked))

    def read(self, key: str, group: str | None, file_name: str | None = None, *,
             locked: bool = False) -> tuple[Path, dict[str, bytes]] | None:
        """(directory, verified files) of the entry `key` in the first root that has it, or None. An
        untrusted entry is skipped with one warning, never moved (not ours to move); a corrupt or
        foreign one is moved aside where ours, under the key's lock (`locked`: the caller holds it
        already). Either is a miss."""
        for root in self.where.reads:
            try:
                files = read_entry(root, key)
            except UntrustedEntry as untrusted:
                _warn_once(f"untrusted:{entry_dir(root, key)}", "kcache: ignoring the Triton entry %s (compiling "
                           "it here instead): %s", entry_dir(root, key), untrusted.reason)
                continue
            except CorruptEntry as err:
                self._refuse(root, key, str(err), locked)
                continue
            if files is None:
                continue
            problem = self._mismatch(files, key, group, file_name)
            if problem:
                self._refuse(root, key, problem, locked)
                continue
            directory = entry_dir(root, key)
            note_use(directory)  # the least recently used are evicted first (KCACHE_MAX_SIZE)
            return directory, files
        return None

    def _mismatch(self, files: dict[str, bytes], key: str, group: str | None, file_name: str | None) -> str:
        meta = bound_meta(files, key)
        if isinstance(meta, str):
            return meta
        if meta.get("triton_key") != self.triton_key:
            return f"{META} names another Triton key: an entry copied from another key"
        if meta.get("group") != group:
            return f"{META} names the group {meta.get('group')!r}, not {group!r}"
        if file_name is not None and file_name not in files:
            return f"it lacks {file_name}"
        if group is not None and group not in files:
            return f"it lacks the group's metadata {group}"
        return ""

    def _refuse(self, root: Path, key: str, reason: str, locked: bool) -> None:
        """A corrupt entry: moved aside where it is in our root and can be; else one warning. Never an
        exception: the caller compiles the kernel either way."""
        store = store_of(root)
        ignoring = f"kcache: ignoring the Triton entry {store.entry_path(key)}: {reason}"
        if root != self.where.write:
            _warn_once(f"corrupt:{store.entry_path(key)}", ignoring)
            return
        try:
            if locked:
                store.quarantine(key, reason)
                return
            lock = self.lock(key)
            lock.acquire(self.where.lock_timeout_s)
            with lock:
                store.quarantine(key, reason)
        except (OSError, CacheLockTimeout) as err:  # PublishError, a failed move, is an OSError
            _warn_once(f"corrupt:{store.entry_path(key)}", f"{ignoring}; it cannot be moved aside "
                       f"({getattr(err, 'strerror', None) or err}): compiling it here, and again in each process "
                       "until its owner or root removes it")

    # ------------------------------------------------------------------ remote tiers

    def fetch(self, key: str, group: str | None, file_name: str | None = None, *,
              locked: bool = False) -> tuple[Path, dict[str, bytes]] | None:
        """The entry `key` from the remote tiers, published into the write root, then read as `read`
        reads it (verified whole, this key's and group's); None where no tier has it."""
        if self.where.remote is None or self.where.write is None or key in self._refused_fetches:
            return None
        if self.where.remote.fetch_into(store_of(self.where.write), key) is None:
            return None
        found = self.read(key, group, file_name, locked=locked)
        if found is None:  # refused (and said so) once: a look again under the lease would refuse it again
            self._refused_fetches.add(key)
        return found

    def upload(self, key: str) -> None:
        if self.where.remote is not None and self.where.write is not None:
            self.where.remote.upload_from(store_of(self.where.write), key)

    # ------------------------------------------------------------------ writes

    def arrivals(self, key: str) -> Arrivals:
        """Naps that end when `key` is published into the write root (kcache/store/arrivals.py)."""
        from kcache.store.arrivals import Arrivals  # a miss's, as the lock

        assert self.where.write is not None
        return Arrivals(store_of(self.where.write).entries_dir, key)

    def lock(self, key: str) -> KeyLock:
        from kcache.store.locks import KeyLock  # a miss's (or a corrupt entry's): a hit takes no lock

        assert self.where.write is not None
        return KeyLock(self.where.write / NAMESPACE / layout.LOCKS / f"{key}.lock", key)

    def publish(self, key: str, group: str | None, files: dict[str, bytes],
                record: dict[str, Any] | None = None, *, upload: bool = True) -> Path | None:
        """Publish `files` as the entry `key` (whole, or not at all); the entry's directory, or None
        where nothing can be written (read-only, a full disk: one warning, the kernel still runs) or
        where another writer's entry holds the key and does not verify as this key's (a planted one).
        `record`: what the compile was asked for (kcache.triton.compile_record), kept beside the key.
        `upload`: to the remote tiers too (a crash record stays local: kcache.triton.crashes)."""
        if self.where.write is None:
            return None
        meta = {"key": key, "triton_key": self.triton_key, "group": group, "files": sorted(files),
                "created": time.time(), **(record or {})}
        store = store_of(self.where.write)
        try:
            outcome = store.publish_files(key, {**files, META: json.dumps(meta, sort_keys=True).encode()})
        except OSError as err:
            _warn_once(f"publish:{self.where.write}", "kcache: cannot save Triton's %s in %s (%s): it runs "
                       "from a private copy, and compiles again in the next process", group or "file",
                       self.where.write, getattr(err, "strerror", None) or err)
            return None
        from kcache.store.entries import PublishOutcome  # loaded by store_of above

        if outcome is PublishOutcome.LOST_RACE:
            log.debug("kcache: another process published the Triton entry %s first", key[:16])
            return store.entry_path(key) if self._verifies(key, group, files) else None
        if upload:
            self.upload(key)
        return store.entry_path(key)

    def _verifies(self, key: str, group: str | None, files: dict[str, bytes]) -> bool:
        """Whether the entry `key` in the write root is trusted, whole and this key's, with the files
        `files` names: a race's winner, checked as a hit is (and left alone, whatever it is)."""
        assert self.where.write is not None
        try:
            found = read_entry(self.where.write, key)
        except (CorruptEntry, UntrustedEntry):
            return False
        return found is not None and not self._mismatch(found, key, group, None) and set(files) <= set(found)


def as_paths(found: tuple[Path, dict[str, bytes]] | None) -> dict[str, str] | None:
    """{file name: path} of an entry `GroupStore.read` found, as Triton takes a group (None: a miss)."""
    if found is None:
        return None
    prefix = os.path.join(found[0], "")
    return {name: prefix + name for name in found[1] if name != META}


_warned: set[str] = set()


def _warn_once(what: str, message: str, *args: object) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(message, *args)
