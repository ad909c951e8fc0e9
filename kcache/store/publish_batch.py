"""Entries staged one by one and published together: `publish_batch(store)` (a bundle's import).

The publish protocol of kcache.store.entries, with the durability paid once for a whole batch. Its
own module: only an importer needs it, and a hit loads none of it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from kcache.errors import KCacheError
from kcache.store import dirfd, layout
from kcache.store.entries import PublishOutcome, check_bound_key, publish_errors, staging_name
from kcache.store.fsutil import fsync_tree_at, sha256_hex, sync_filesystem, write_new_at
from kcache.store.manifest import MANIFEST_NAME, format_manifest, is_entry_file_name, verify_entry_at

if TYPE_CHECKING:
    from kcache.store.entries import EntryStore

# A batch runs the steps of entries.PUBLISH_STEPS before "renamed" for each entry, then these once,
# then "renamed" for each entry.
BATCH_STEPS = ("staged_all", "synced")


@contextlib.contextmanager
def publish_batch(store: EntryStore) -> Iterator[PublishBatch]:
    """`with publish_batch(store) as batch:` stage entries with `batch.stage(...)` (from any thread),
    then `batch.publish()` makes them visible together. Leaving the block removes every staging
    directory the batch still holds: all of them when a stage failed or `publish()` was never
    reached, so a failed batch publishes nothing. The caller must have stopped every thread that
    stages into the batch before the block ends."""
    with contextlib.ExitStack() as held:
        staging_root_fd, entries_fd = store.open_publish_dirs(held)
        batch = PublishBatch(store, staging_root_fd, entries_fd)
        try:
            yield batch
        finally:
            batch.discard()


class PublishBatch:
    """Entries staged one by one, from any thread, and published together (`publish_batch`).

    The protocol of `publish`, with the durability paid once for the whole batch: each entry is
    written into a staging directory of its own without an fsync, its manifest made from the digests
    its writer computed over the same bytes, and verified from disk; `publish()` then makes them all
    durable with one `sync_filesystem` of the root's filesystem, renames each into place and fsyncs
    the entries directory once. Nothing is visible before every entry is staged, verified and
    synced; a crash before the renames leaves staging directories only (gc removes them), and one
    during the renames leaves whole entries and staging directories.
    """

    def __init__(self, store: EntryStore, staging_root_fd: int, entries_fd: int) -> None:
        self._store = store
        self._staging_root_fd = staging_root_fd
        self._entries_fd = entries_fd
        self._lock = threading.Lock()
        self._staged: dict[str, str] = {}  # key -> its staging directory's name, in staging order
        self._staging_now = 0  # stage() calls under way: publish() must not overtake one
        self._failed = False
        self._closed = False

    def stage(self, key: str, files: Mapping[str, bytes], digests: Mapping[str, str] | None = None) -> None:
        """Write `key`'s entry into a staging directory and verify it from disk; visible only at
        `publish()`. A manifest among `files` is not copied: the store writes its own, from
        `digests` (sha256 hex per file, computed by the caller over these same bytes) where given,
        else from hashing `files` here. Raises like `EntryStore.publish` (PublishError, CorruptEntry,
        KCacheError); the batch is then never published."""
        store = self._store
        store.check_name(key)
        components = {name: data for name, data in files.items() if name != MANIFEST_NAME}
        with self._lock:
            if self._closed:
                raise RuntimeError("this batch was published or discarded: it stages nothing more")
            if key in self._staged:
                raise ValueError(f"{key} is staged twice in one batch")
            name = staging_name(key)
            self._staged[key] = name  # before the mkdir: whatever happens next, discard() removes it
            self._staging_now += 1
        staging = store.staging_dir / name
        try:
            bad = sorted(n for n in components if not is_entry_file_name(n))
            if bad:
                raise KCacheError(f"{staging}: {bad} cannot name files of an entry; nothing was published")
            store.check_required(staging, components)
            if store.bind_key:
                check_bound_key(str(staging), components, key)
            manifest = format_manifest({n: (len(data), digests[n] if digests is not None else sha256_hex(data))
                                        for n, data in components.items()})
            with publish_errors(staging, "creating the staging directory"):
                staging_fd = store.make_staging(self._staging_root_fd, name)
            try:
                with publish_errors(staging, "writing the staged entry"):
                    store.reach_step("staging_created")
                    for component, data in components.items():
                        write_new_at(staging_fd, component, data, durable=False)
                    store.reach_step("components_written")
                    write_new_at(staging_fd, MANIFEST_NAME, manifest, durable=False)
                    store.reach_step("manifest_written")
                    verify_entry_at(staging_fd, staging, store.required, exact=store.bind_key)
                    store.reach_step("verified")
            finally:
                os.close(staging_fd)
        except BaseException:
            with self._lock:
                self._failed = True
            raise
        finally:
            with self._lock:
                self._staging_now -= 1

    def publish(self) -> dict[str, PublishOutcome]:
        """Make every staged entry durable, then visible: one `sync_filesystem` (an fsync per file
        and per staging directory where there is no syncfs), a rename per entry (LOST_RACE where the
        key is already there), one fsync of the entries directory. Each key's outcome."""
        store = self._store
        with self._lock:
            if self._failed or self._staging_now or self._closed:
                raise RuntimeError("a batch is published once, after every stage() returned without an error")
            self._closed = True
            staged = list(self._staged.items())
        if not staged:
            return {}  # nothing to sync: a syncfs would wait for other programs' writes for nothing
        store.reach_step("staged_all")
        with publish_errors(store.staging_dir, "syncing the staged entries"):
            if not sync_filesystem(self._staging_root_fd):
                for _key, name in staged:
                    fsync_tree_at(self._staging_root_fd, name)
        store.reach_step("synced")
        outcomes: dict[str, PublishOutcome] = {}
        for key, name in staged:
            outcomes[key] = store.rename_into_place(self._staging_root_fd, self._entries_fd, name, key)
            with self._lock:
                del self._staged[key]  # renamed, or removed after a lost race
        if PublishOutcome.PUBLISHED in outcomes.values():
            store.fsync_entries_dir(self._entries_fd, f"{len(outcomes)} entries")
        return outcomes

    def release(self, key: str) -> str:
        """Hand `key`'s staged entry over to another process's batch (`adopt`): this batch neither
        publishes nor removes it any more. Its staging directory's name."""
        with self._lock:
            return self._staged.pop(key)

    def adopt(self, key: str, name: str) -> None:
        """Take into this batch an entry another process staged and verified under `name` in the
        same root's `.staging` (its batch `release`d it): published or discarded with the others. The
        name must be a staging directory's name for `key`; the rename is by this batch's held
        `.staging` descriptor, so a `.staging` swapped under the other process only fails it."""
        parsed = layout.StagingName.parse(name)
        if parsed is None or parsed.key != layout.staging_key(key):
            raise ValueError(f"{name!r} is no staging directory of {key[:16]}")
        with self._lock:
            if self._closed:
                raise RuntimeError("this batch was published or discarded: it adopts nothing more")
            if key in self._staged:
                raise ValueError(f"{key} is staged twice in one batch")
            self._staged[key] = name

    def discard(self) -> None:
        """Remove every staging directory the batch still holds; no more stage() after it. Failures
        are logged, never raised: a rollback must not hide the error that led to it."""
        with self._lock:
            self._closed = True
            leftover, self._staged = list(self._staged.values()), {}
        for name in leftover:
            dirfd.remove_tree_at(self._staging_root_fd, name, "discarding an unpublished batch")
