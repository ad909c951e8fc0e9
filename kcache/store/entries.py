"""The crash-safe entry store: stage, verify, publish with one rename.

This is the one implementation of the publish protocol (docs/design.md);
kernel entries and autotune results both go through it. It knows nothing
about TileLang: an entry is a directory of named files plus a manifest.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from kcache.errors import CorruptEntry, KCacheError, PublishError
from kcache.store import layout
from kcache.store.fsutil import RENAME_RACE_ERRNOS, ensure_dir, fsync_dir, make_dir, remove_tree, write_durable
from kcache.store.manifest import MANIFEST_NAME, build_manifest, verify_entry

log = logging.getLogger("kcache")

# Names of the publish steps, in order. Tests inject crashes at each one
# through `EntryStore.fault_hook`.
PUBLISH_STEPS = ("staging_created", "components_written", "manifest_written", "verified", "renamed")


class PublishOutcome(Enum):
    PUBLISHED = "published"
    LOST_RACE = "lost_race"  # another writer published the same key first


class EntryStore:
    """Entries of one kind (`namespace`) under a cache root."""

    # Called with each step name of PUBLISH_STEPS; tests use it to crash or
    # pause a writer at a precise point. None in normal operation.
    fault_hook: Callable[[str], None] | None = None

    def __init__(self, root: Path, namespace: str, required: frozenset[str],
                 check_name: Callable[[str], str] = layout.check_key) -> None:
        """`check_name` validates entry names: hex keys by default; `layout.check_entry_name` for
        caller-chosen directory names (an autotune result saved to a path)."""
        self.root = Path(root)
        self.check_name = check_name
        self.namespace = namespace
        self.required = frozenset(required)
        self.entries_dir = self.root / namespace
        self.staging_dir = layout.staging_root(self.root)
        self.quarantine_dir = self.root / layout.QUARANTINE

    def entry_path(self, key: str) -> Path:
        return self.entries_dir / self.check_name(key)

    def read(self, key: str) -> dict[str, bytes] | None:
        """The verified files of `key`'s entry, or None on a miss.

        Raises CorruptEntry when an entry exists but fails verification; the
        caller decides when to quarantine it (under the key's lock).
        """
        try:
            return verify_entry(self.entry_path(key), self.required)
        except FileNotFoundError:
            return None

    def publish(self, key: str, fill: Callable[[Path], None]) -> PublishOutcome:
        """Stage the entry with `fill(staging_dir)`, verify it, publish it atomically.

        `fill` writes the component files (with `write_durable`). Nothing is
        visible under the entry path until every component is on disk and
        matches the manifest. Any failure removes the staging directory.
        """
        target = self.entry_path(key)
        staging = self.staging_dir / str(layout.StagingName.fresh(layout.staging_key(key)))
        try:
            ensure_dir(self.staging_dir)
            ensure_dir(self.entries_dir)
            make_dir(staging)
        except OSError as err:
            raise PublishError(str(staging), err, "creating the staging directory") from err
        try:
            self._step("staging_created")
            fill(staging)
            self._step("components_written")
            self._write_manifest(staging)
            self._step("manifest_written")
            verify_entry(staging, self.required)
            fsync_dir(staging)
            self._step("verified")
        except KCacheError:
            # kcache's own errors (a compile that timed out is a TimeoutError, so an
            # OSError too) are the fill's failure, not the filesystem's.
            remove_tree(staging, "cleaning up a failed publish")
            raise
        except OSError as err:
            remove_tree(staging, "cleaning up a failed publish")
            raise PublishError(str(staging), err, "writing the staged entry") from err
        except BaseException:
            remove_tree(staging, "cleaning up a failed publish")
            raise
        try:
            os.rename(staging, target)
        except OSError as err:
            remove_tree(staging, "cleaning up after the publishing rename")
            if err.errno in RENAME_RACE_ERRNOS:
                log.debug("kcache: lost the publish race for %s", target)
                return PublishOutcome.LOST_RACE
            raise PublishError(str(target), err, "publishing") from err
        self._step("renamed")
        try:
            fsync_dir(self.entries_dir)
        except OSError as err:
            # The rename happened and the entry is complete and visible; only
            # its durability across a power loss is in doubt.
            log.warning("kcache: published %s but could not fsync %s: %s", target, self.entries_dir, err)
        return PublishOutcome.PUBLISHED

    def quarantine(self, key: str, reason: str) -> Path | None:
        """Move a corrupt entry aside atomically; None if it is already gone.

        Never deletes in place: other processes may have files of it open
        or mapped. The caller must hold the key's lock, so that a fresh entry
        published by someone else is never the one moved.
        """
        source = self.entry_path(key)
        ensure_dir(self.quarantine_dir)
        dest = self.quarantine_dir / f"{key}.{int(time.time())}.{uuid.uuid4().hex[:8]}"
        try:
            os.rename(source, dest)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise PublishError(str(source), err, "quarantining the corrupt entry") from err
        try:
            write_durable(dest / "QUARANTINED.txt", f"{reason}\n".encode())
        except OSError as err:
            log.warning("kcache: could not record why %s was quarantined: %s", dest, err)
        log.warning("kcache: quarantined corrupt entry %s -> %s: %s", source, dest, reason)
        return dest

    def keys(self) -> list[str]:
        try:
            return sorted(name for name in os.listdir(self.entries_dir) if layout.is_key(name))
        except FileNotFoundError:
            return []

    def _write_manifest(self, staging: Path) -> None:
        missing = self.required - set(os.listdir(staging))
        if missing:
            raise KCacheError(f"{staging}: the entry lacks required component(s) {sorted(missing)}; nothing was published")
        try:
            manifest = build_manifest(staging)
        except ValueError as err:
            raise CorruptEntry(str(staging), str(err)) from err
        write_durable(staging / MANIFEST_NAME, manifest)

    def _step(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)
