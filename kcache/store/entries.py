"""The crash-safe entry store: stage, verify, publish with one rename.

This is the one implementation of the publish protocol (docs/design/store.md);
kernel entries and autotune results both go through it. It knows nothing
about TileLang: an entry is a directory of named files plus a manifest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from kcache.errors import CorruptEntry, KCacheError, PublishError
from kcache.store import dirfd, layout
from kcache.store.fsutil import (
    RENAME_RACE_ERRNOS,
    ensure_dir,
    fsync_tree_at,
    make_dir_at,
    make_dirs_at,
    sha256_hex,
    sync_filesystem,
    write_durable,
    write_durable_at,
    write_new_at,
)
from kcache.store.manifest import (
    MANIFEST_NAME,
    build_manifest_at,
    format_manifest,
    is_entry_file_name,
    verify_entry,
    verify_entry_at,
)

log = logging.getLogger("kcache")

# Names of the publish steps, in order. Tests inject crashes at each one
# through `EntryStore.fault_hook`.
PUBLISH_STEPS = ("staging_created", "components_written", "manifest_written", "verified", "renamed")
# A batch (`PublishBatch`) runs the steps before "renamed" for each entry, then these once, then
# "renamed" for each entry.
BATCH_STEPS = ("staged_all", "synced")


def check_bound_key(where: str, files: dict[str, bytes], key: str, meta: str = "meta.json") -> None:
    """An entry's meta.json must name the key it is stored (or was asked) under: a verified entry
    copied or replayed under another key is another kernel, and is refused. Raises CorruptEntry."""
    try:
        bound = json.loads(files[meta]).get("key")
    except (KeyError, ValueError, AttributeError, TypeError):
        bound = None
    if bound != key:
        raise CorruptEntry(where, f"{meta} names the key {str(bound)[:16]!r}, not {key[:16]!r}: an entry copied "
                           "from another key")


class PublishOutcome:
    """What a publish came to: `PUBLISHED`, or `LOST_RACE` (another writer published the same key
    first). Two singletons, compared with `is`. (Not an Enum: building one costs a fresh process's hit
    about 0.1 ms of import.)"""

    __slots__ = ("value",)
    PUBLISHED: PublishOutcome
    LOST_RACE: PublishOutcome

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"PublishOutcome.{self.value.upper()}"


PublishOutcome.PUBLISHED = PublishOutcome("published")
PublishOutcome.LOST_RACE = PublishOutcome("lost_race")


class EntryStore:
    """Entries of one kind (`namespace`) under a cache root."""

    # Called with each step name of PUBLISH_STEPS; tests use it to crash or
    # pause a writer at a precise point. None in normal operation.
    fault_hook: Callable[[str], None] | None = None

    def __init__(self, root: Path, namespace: str, required: frozenset[str],
                 check_name: Callable[[str], str] = layout.check_key, *, bind_key: bool = False,
                 trusted: bool = True) -> None:
        """`check_name` validates entry names: hex keys by default; `layout.check_entry_name` for
        caller-chosen directory names (an autotune result saved to a path). `bind_key` (kernel
        entries): an entry's meta.json must name its key, and it holds exactly `required`. `trusted`: reads check trust on every
        descriptor from the root down (UntrustedEntry) before a byte is read."""
        self.bind_key = bind_key
        self.trusted = trusted
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
        path = self.entry_path(key)
        try:
            files = verify_entry(path, self.required, trust_root=self.root if self.trusted else None,
                                 exact=self.bind_key)
        except FileNotFoundError:
            return None
        if self.bind_key:
            check_bound_key(str(path), files, key)
        return files

    def read_with_manifest(self, key: str) -> dict[str, bytes] | None:
        """`read(key)`, its manifest.json added: an entry as it travels (a remote value, a bundle)."""
        files = self.read(key)
        if files is None:
            return None
        return {**files, MANIFEST_NAME: (self.entry_path(key) / MANIFEST_NAME).read_bytes()}

    def publish_files(self, key: str, files: dict[str, bytes]) -> PublishOutcome:
        """`publish` an entry whose files are in memory (fetched, or from a bundle). A manifest among
        them is not copied: the store writes its own and verifies the files against it."""

        def fill(staging: Path) -> None:
            for name, data in files.items():
                if name != MANIFEST_NAME:
                    write_durable(staging / name, data)

        return self.publish(key, fill)

    def publish(self, key: str, fill: Callable[[Path], None]) -> PublishOutcome:
        """Stage the entry with `fill(staging_dir)`, verify it, publish it atomically.

        `fill` writes the component files (with `write_durable`). Nothing is
        visible under the entry path until every component is on disk and
        matches the manifest. Any failure removes the staging directory.

        Everything after `fill` works on descriptors opened with O_NOFOLLOW when the staging
        directory was made (`.staging`, the entries directory, the staging directory itself): the
        manifest is written into, and verified from, the directory that was made, and the rename
        is between those descriptors. A link swapped in for `.staging` or the entries directory
        meanwhile is never written or renamed through; files `fill` wrote through it are missing
        from the held directory, so the publish fails and nothing is published.
        """
        self.check_name(key)
        with contextlib.ExitStack() as held:
            staging_root_fd, entries_fd = self._open_publish_dirs(held)
            name = _staging_name(key)
            staging = self.staging_dir / name
            with _publish_errors(staging, "creating the staging directory"):
                staging_fd = self._make_staging(staging_root_fd, name)
            held.callback(os.close, staging_fd)
            try:
                with _publish_errors(staging, "writing the staged entry"):
                    self._step("staging_created")
                    fill(staging)
                    self._step("components_written")
                    self._write_manifest(staging_fd, staging)
                    self._step("manifest_written")
                    verify_entry_at(staging_fd, staging, self.required, exact=self.bind_key)
                    os.fsync(staging_fd)
                    self._step("verified")
            except BaseException:
                dirfd.remove_tree_at(staging_root_fd, name, "cleaning up a failed publish")
                raise
            outcome = self._rename_into_place(staging_root_fd, entries_fd, name, key)
            if outcome is PublishOutcome.PUBLISHED:
                self._fsync_entries_dir(entries_fd, str(self.entry_path(key)))
            return outcome

    @contextlib.contextmanager
    def publish_batch(self) -> Iterator[PublishBatch]:
        """`with store.publish_batch() as batch:` stage entries with `batch.stage(...)` (from any
        thread), then `batch.publish()` makes them visible together. Leaving the block removes every
        staging directory the batch still holds: all of them when a stage failed or `publish()` was
        never reached, so a failed batch publishes nothing. The caller must have stopped every thread
        that stages into the batch before the block ends."""
        with contextlib.ExitStack() as held:
            staging_root_fd, entries_fd = self._open_publish_dirs(held)
            batch = PublishBatch(self, staging_root_fd, entries_fd)
            try:
                yield batch
            finally:
                batch.discard()

    def _open_publish_dirs(self, held: contextlib.ExitStack) -> tuple[int, int]:
        """Descriptors of `.staging` and the entries directory, each made if missing and opened with
        O_NOFOLLOW from the root's descriptor, closed by `held`: a publish holds them from its first
        staging directory to its last rename, and never resolves their paths again."""
        try:
            ensure_dir(self.root)  # the root by path: the user's configured choice (docs/security.md)
            root_fd = dirfd.open_root(self.root)
            held.callback(os.close, root_fd)
            staging_root_fd = make_dirs_at(root_fd, *Path(layout.STAGING).parts)
            held.callback(os.close, staging_root_fd)
            entries_fd = make_dirs_at(root_fd, *Path(self.namespace).parts)
            held.callback(os.close, entries_fd)
        except OSError as err:
            raise PublishError(str(self.staging_dir), err, "creating the staging directory") from err
        return staging_root_fd, entries_fd

    @staticmethod
    def _make_staging(staging_root_fd: int, name: str) -> int:
        """Make staging directory `name` in the held `.staging`; its descriptor (O_NOFOLLOW)."""
        make_dir_at(staging_root_fd, name)
        return os.open(name, dirfd.DIR_FLAGS, dir_fd=staging_root_fd)

    def _rename_into_place(self, staging_root_fd: int, entries_fd: int, name: str, key: str) -> PublishOutcome:
        """The publishing rename, between held descriptors. A rename race (the key is already there)
        is LOST_RACE; either way a staging directory that was not renamed is removed."""
        target = self.entry_path(key)
        try:
            os.rename(name, target.name, src_dir_fd=staging_root_fd, dst_dir_fd=entries_fd)
        except OSError as err:
            dirfd.remove_tree_at(staging_root_fd, name, "cleaning up after the publishing rename")
            if err.errno in RENAME_RACE_ERRNOS:
                log.debug("kcache: lost the publish race for %s", target)
                return PublishOutcome.LOST_RACE
            raise PublishError(str(target), err, "publishing") from err
        self._step("renamed")
        return PublishOutcome.PUBLISHED

    def _fsync_entries_dir(self, entries_fd: int, what: str) -> None:
        try:
            os.fsync(entries_fd)
        except OSError as err:
            # The rename happened and the entry is complete and visible; only
            # its durability across a power loss is in doubt.
            log.warning("kcache: published %s but could not fsync %s: %s", what, self.entries_dir, err)

    def quarantine(self, key: str, reason: str) -> Path | None:
        """Move a corrupt entry aside atomically; None if it is already gone.

        Never deletes in place: other processes may have files of it open
        or mapped. The caller must hold the key's lock, so that a fresh entry
        published by someone else is never the one moved.
        """
        source = self.entry_path(key)
        name = f"{key}.{int(time.time())}.{uuid.uuid4().hex[:8]}"
        dest = self.quarantine_dir / name
        try:
            # By descriptor: a `.quarantine` (or an entries directory) that is a link is refused.
            with dirfd.subdir(self.root) as root_fd:
                assert root_fd is not None
                with contextlib.suppress(FileExistsError):
                    make_dir_at(root_fd, layout.QUARANTINE)
                quarantine_fd = dirfd.open_dir_at(root_fd, layout.QUARANTINE)
                entries_fd = dirfd.open_dirs_at(root_fd, *Path(self.namespace).parts)
                try:
                    if quarantine_fd is None or entries_fd is None:
                        return None
                    os.rename(source.name, name, src_dir_fd=entries_fd, dst_dir_fd=quarantine_fd)
                finally:
                    for fd in (quarantine_fd, entries_fd):
                        if fd is not None:
                            os.close(fd)
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

    def _write_manifest(self, staging_fd: int, staging: Path) -> None:
        self._check_required(staging, os.listdir(staging_fd))
        try:
            manifest = build_manifest_at(staging_fd, staging)
        except ValueError as err:
            raise CorruptEntry(str(staging), str(err)) from err
        write_durable_at(staging_fd, MANIFEST_NAME, manifest)

    def _check_required(self, staging: Path, names: Iterable[str]) -> None:
        missing = self.required - set(names)
        if missing:
            raise KCacheError(f"{staging}: the entry lacks required component(s) {sorted(missing)}; nothing was published")

    def _step(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)


class PublishBatch:
    """Entries staged one by one, from any thread, and published together (`EntryStore.publish_batch`).

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
            name = _staging_name(key)
            self._staged[key] = name  # before the mkdir: whatever happens next, discard() removes it
            self._staging_now += 1
        staging = store.staging_dir / name
        try:
            bad = sorted(n for n in components if not is_entry_file_name(n))
            if bad:
                raise KCacheError(f"{staging}: {bad} cannot name files of an entry; nothing was published")
            store._check_required(staging, components)
            if store.bind_key:
                check_bound_key(str(staging), components, key)
            manifest = format_manifest({n: (len(data), digests[n] if digests is not None else sha256_hex(data))
                                        for n, data in components.items()})
            with _publish_errors(staging, "creating the staging directory"):
                staging_fd = store._make_staging(self._staging_root_fd, name)
            try:
                with _publish_errors(staging, "writing the staged entry"):
                    store._step("staging_created")
                    for component, data in components.items():
                        write_new_at(staging_fd, component, data, durable=False)
                    store._step("components_written")
                    write_new_at(staging_fd, MANIFEST_NAME, manifest, durable=False)
                    store._step("manifest_written")
                    verify_entry_at(staging_fd, staging, store.required, exact=store.bind_key)
                    store._step("verified")
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
        store._step("staged_all")
        with _publish_errors(store.staging_dir, "syncing the staged entries"):
            if not sync_filesystem(self._staging_root_fd):
                for _key, name in staged:
                    fsync_tree_at(self._staging_root_fd, name)
        store._step("synced")
        outcomes: dict[str, PublishOutcome] = {}
        for key, name in staged:
            outcomes[key] = store._rename_into_place(self._staging_root_fd, self._entries_fd, name, key)
            with self._lock:
                del self._staged[key]  # renamed, or removed after a lost race
        if PublishOutcome.PUBLISHED in outcomes.values():
            store._fsync_entries_dir(self._entries_fd, f"{len(outcomes)} entries")
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


def _staging_name(key: str) -> str:
    return str(layout.StagingName.fresh(layout.staging_key(key)))


@contextlib.contextmanager
def _publish_errors(where: Path, doing: str) -> Iterator[None]:
    """An OSError while `doing` is the filesystem's failure: a PublishError naming `where`. kcache's
    own errors pass as they are (a compile that timed out is a TimeoutError, so an OSError too)."""
    try:
        yield
    except KCacheError:
        raise
    except OSError as err:
        raise PublishError(str(where), err, doing) from err
