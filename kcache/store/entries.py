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
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kcache.errors import CorruptEntry, KCacheError, PublishError
from kcache.store import dirfd, layout
from kcache.store.fsutil import (
    RENAME_RACE_ERRNOS,
    ensure_dir,
    make_dir_at,
    make_dirs_at,
    write_durable,
    write_durable_at,
)
from kcache.store.manifest import (
    MANIFEST_NAME,
    build_manifest_at,
    read_verified,
    verify_entry_at,
)

log = logging.getLogger("kcache")

# Names of the publish steps, in order. Tests inject crashes at each one
# through `EntryStore.fault_hook`.
PUBLISH_STEPS = ("staging_created", "components_written", "manifest_written", "verified", "renamed")


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
                 trusted: bool = True, trust_root: Path | None = None) -> None:
        """`check_name` validates entry names: hex keys by default; `layout.check_entry_name` for
        caller-chosen directory names (an autotune result saved to a path). `bind_key` (kernel
        entries): an entry's meta.json must name its key, and it holds exactly `required`. `trusted`: reads check trust on every
        descriptor from `trust_root` (default: `root`) down (UntrustedEntry) before a byte is read: the
        cache root, where a store lives in a subdirectory of it (Triton's `<root>/triton`)."""
        self.bind_key = bind_key
        self.trusted = trusted
        self.root = Path(root)
        self.trust_root = self.root if trust_root is None else Path(trust_root)
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
        files = read_verified(path, self.required, trust_root=self.trust_root if self.trusted else None,
                              exact=self.bind_key)
        if files is None:
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
            staging_root_fd, entries_fd = self.open_publish_dirs(held)
            name = staging_name(key)
            staging = self.staging_dir / name
            with publish_errors(staging, "creating the staging directory"):
                staging_fd = self.make_staging(staging_root_fd, name)
            held.callback(os.close, staging_fd)
            try:
                with publish_errors(staging, "writing the staged entry"):
                    self.reach_step("staging_created")
                    fill(staging)
                    self.reach_step("components_written")
                    self._write_manifest(staging_fd, staging)
                    self.reach_step("manifest_written")
                    verify_entry_at(staging_fd, staging, self.required, exact=self.bind_key)
                    os.fsync(staging_fd)
                    self.reach_step("verified")
            except BaseException:
                dirfd.remove_tree_at(staging_root_fd, name, "cleaning up a failed publish")
                raise
            outcome = self.rename_into_place(staging_root_fd, entries_fd, name, key)
            if outcome is PublishOutcome.PUBLISHED:
                self.fsync_entries_dir(entries_fd, str(self.entry_path(key)))
            return outcome

    def open_publish_dirs(self, held: contextlib.ExitStack) -> tuple[int, int]:
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
    def make_staging(staging_root_fd: int, name: str) -> int:
        """Make staging directory `name` in the held `.staging`; its descriptor (O_NOFOLLOW)."""
        make_dir_at(staging_root_fd, name)
        return os.open(name, dirfd.DIR_FLAGS, dir_fd=staging_root_fd)

    def rename_into_place(self, staging_root_fd: int, entries_fd: int, name: str, key: str) -> PublishOutcome:
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
        self.reach_step("renamed")
        return PublishOutcome.PUBLISHED

    def fsync_entries_dir(self, entries_fd: int, what: str) -> None:
        """After a publishing rename: the entries directory to disk (a failure is a warning)."""
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
        self.check_required(staging, os.listdir(staging_fd))
        try:
            manifest = build_manifest_at(staging_fd, staging)
        except ValueError as err:
            raise CorruptEntry(str(staging), str(err)) from err
        write_durable_at(staging_fd, MANIFEST_NAME, manifest)

    def check_required(self, staging: Path, names: Iterable[str]) -> None:
        """A staged entry holds every component the store requires, or nothing is published."""
        missing = self.required - set(names)
        if missing:
            raise KCacheError(f"{staging}: the entry lacks required component(s) {sorted(missing)}; nothing was published")

    def reach_step(self, name: str) -> None:
        """A publish reached step `name`: the fault hook's point (tests kill or fail a publish there)."""
        if self.fault_hook is not None:
            self.fault_hook(name)


def staging_name(key: str) -> str:
    """A fresh staging directory's name for `key` (`layout.StagingName`)."""
    return str(layout.StagingName.fresh(layout.staging_key(key)))


@contextlib.contextmanager
def publish_errors(where: Path, doing: str) -> Iterator[None]:
    """An OSError while `doing` is the filesystem's failure: a PublishError naming `where`. kcache's
    own errors pass as they are (a compile that timed out is a TimeoutError, so an OSError too)."""
    try:
        yield
    except KCacheError:
        raise
    except OSError as err:
        raise PublishError(str(where), err, doing) from err
