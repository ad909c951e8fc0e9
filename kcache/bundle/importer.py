"""Deployment bundles: a root's kernel entries in one signed file, imported whole or not at all.

A bundle is an uncompressed tar (entries are mostly compiled code; import speed matters more than
size) of, in this order:

    kcache-bundle.json           the bundle manifest: format, toolchains, archs, and every entry's
                                 files with their sizes and sha256
    kcache-bundle.sig            HMAC-SHA256 of the manifest with KCACHE_BUNDLE_SECRET (when set)
    kernels/<key>/<component>    each entry's files, manifest.json included
    triton/<key>/<file>          each Triton entry's files (kcache.triton: a compile group, or a
                                 file Triton put alone), kcache-triton.json and manifest.json included
    helion/<key>/<file>          each Helion pick's files (kcache.helion): its value, kcache-helion.json
                                 and manifest.json

Import trusts nothing in the file but what the signature covers: member names must be exactly
those the manifest lists (no `..`, no absolute path, no link or device, no duplicate), every file
must match its size and sha256, every entry must hold exactly a kernel entry's components and its
meta.json must name its key (a Triton entry: its kcache-triton.json must name its key, the Triton
key that key is the name of, and exactly its files; a Helion pick: its kcache-helion.json must name its
key and the Helion key that key is the name of, and its value must be a pick Helion may read:
kcache.bundle.sections). The file is opened once, by one descriptor (kcache.bundle.reader:
a FIFO or a link at the path is refused at once), and read once, in order (the manifest first, each
entry's files together). Nothing is read before its size is checked: a header's payload against a
small cap, the manifest and signature against theirs, an entry's file against the size the manifest
gives it, so memory stays bounded whatever the archive claims. Each entry is verified and staged in
a worker thread (or a stager process) as soon as it is read, and only once the whole bundle is
verified and staged are the entries renamed into place, in one batch of the store's protocol
(`publish_batch`: one syncfs, then the renames), so a reader, a second importer or a
crash never sees half an entry, and a refused bundle leaves nothing. Unsigned bundles import only
when asked (`allow_unsigned`), since whoever wrote one is trusted with code.

This module is the import; export is kcache.bundle.export, the coverage check
kcache.bundle.coverage (both re-exported here, the package's public names).

Why HMAC and not Ed25519: the `cryptography` package is not a dependency, and a bundle goes from one
organisation's build to its own servers, which can share a secret as they share the remote tier's.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache.bundle.coverage import bundle_keys, missing_coverage, read_key_list, read_key_records
from kcache.bundle.entries import BundleError, EntryFate, EntryImport
from kcache.bundle.export import ExportReport, export_bundle
from kcache.bundle.manifest import (
    FROM_ENVIRONMENT,
    MANIFEST_MEMBER,
    MAX_MANIFEST_BYTES,
    SIGNATURE_MEMBER,
    bundle_secret,
    parse_manifest,
    signer,
    toolchain_mismatch,
)
from kcache.bundle.reader import BundleMember, BundleReader, open_bundle
from kcache.bundle.sections import SECTIONS
from kcache.bundle.stager import ProcessStaging, stager_count
from kcache.interruption import Interrupted, signals_deferred
from kcache.setting_values import default_root
from kcache.store.access import create_root
from kcache.store.components import COMPONENTS, KERNELS
from kcache.store.entries import EntryStore, PublishOutcome
from kcache.store.publish_batch import publish_batch
from kcache.tilelang.installed import require_tilelang

__all__ = [
    "BundleError", "CURRENT_TOOLCHAIN", "ExportReport", "FROM_ENVIRONMENT", "ImportReport", "MANIFEST_MEMBER",
    "SIGNATURE_MEMBER", "bundle_keys", "export_bundle", "import_bundle", "missing_coverage", "read_key_list",
    "read_key_records",
]

# Import verifies and stages entries in threads (sha256, writes and reads release the GIL); a few
# entries per worker are read ahead, so a bundle's bytes are never all in memory at once. Four: on
# the 16-core H100 machine (2026-11-24, 2000 entries of 512 KB) 2, 4, 8 and 16 threads staged in
# 3.1, 2.9, 3.5 and 3.7-4.6 s: past four, the threads contend (the GIL for the Python part of each
# file, and the allocator for each file's bytes) more than they overlap.
MAX_IMPORT_WORKERS = 4
IN_FLIGHT_PER_WORKER = 2


@dataclass
class ImportReport:
    bundle: str
    imported: int = 0
    already_present: int = 0
    filtered_out: int = 0  # entries of other archs (`archs=`)
    triton: int = 0  # of `imported`, Triton's entries (kcache.triton)
    helion: int = 0  # of `imported`, Helion's picks (kcache.helion)
    bytes: int = 0
    seconds: float = 0.0
    stage_seconds: float = 0.0  # reading, verifying and staging every entry (the checks included)
    publish_seconds: float = 0.0  # the one sync, the renames


CURRENT_TOOLCHAIN: Any = object()  # the default of `toolchain=`: this machine's


def import_bundle(bundle: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                  secret: str | None = FROM_ENVIRONMENT, allow_unsigned: bool = False,
                  archs: Iterable[str] | None = None, toolchain: Any = CURRENT_TOOLCHAIN) -> ImportReport:
    """Verify the whole bundle, then publish its entries into `root` (default: the default root).
    Raises BundleError, naming the bundle and what is wrong, before anything is published when any
    check fails.

    `secret` (default: KCACHE_BUNDLE_SECRET): the bundle's signature must verify with it. Without
    one, a signed bundle cannot be checked and is refused, and an unsigned one imports only with
    `allow_unsigned=True`. `archs`: import only entries built for these archs. `toolchain`: a
    bundle built by another toolchain than this (default: this machine's, which imports TileLang;
    None: no check) is refused, naming the fields that differ.

    The file is opened once and read once: each entry, as soon as its files are read, is verified and
    staged in a worker thread (`publish_batch`); the staged entries are renamed into place
    only once the whole bundle is verified and staged, and are all removed when anything is refused
    (or the import is interrupted: under kcache.interruption, a signal that arrives during the
    renames waits for the last one, and `Interrupted.done` then says what was imported).
    A missing `root` is created as kcache creates every root (0700, or 2770 in group mode)."""
    started = time.perf_counter()
    path = Path(bundle)
    root = Path(root) if root is not None else default_root()
    secret = bundle_secret(secret)
    if toolchain is CURRENT_TOOLCHAIN:
        require_tilelang("or skip the toolchain check: kcache import --any-toolchain, import_bundle(toolchain=None)")
        from kcache.tilelang.fingerprint import toolchain_fingerprint

        toolchain = toolchain_fingerprint(root, persist=False)
    report = ImportReport(str(path))
    with open_bundle(path) as reader:
        manifest_member = reader.manifest_member()
        signature = reader.read_signature()
        if secret:
            if signature is None:
                raise BundleError(str(path), "it is not signed, and KCACHE_BUNDLE_SECRET is set: refused")
            # Verified as it is read, a chunk at a time: an unsigned manifest is never held whole.
            expected = reader.digest_of(manifest_member, signer(secret)).hexdigest().encode()
            if not hmac.compare_digest(signature, expected):
                raise BundleError(str(path), "its signature does not verify with KCACHE_BUNDLE_SECRET (another "
                                  "secret, or the bundle was changed after it was signed)")
        elif signature is not None:
            raise BundleError(str(path), "it is signed: set KCACHE_BUNDLE_SECRET to the secret it was signed with")
        elif not allow_unsigned:
            raise BundleError(str(path), "it is not signed: sign bundles with KCACHE_BUNDLE_SECRET at export, or "
                              "import with --unsigned if you trust whoever wrote it (a bundle holds code)")
        manifest = parse_manifest(reader.read(manifest_member, MAX_MANIFEST_BYTES), path)
        # The toolchain is TileLang's: Triton's key holds Triton's own version and compiler hash.
        if toolchain is not None and manifest["entries"] and manifest["toolchains"] != [toolchain]:
            raise BundleError(str(path), toolchain_mismatch(manifest["toolchains"], toolchain))
        listings: dict[str, dict[str, Any]] = {KERNELS: manifest["entries"],
                                               **{section.folder: manifest[section.folder] for section in SECTIONS}}
        allowed_archs = set(archs) if archs is not None else None
        create_root(root)  # not the staging's mkdir: a root is private, and marked as kcache's
        store = EntryStore(root, KERNELS, COMPONENTS, bind_key=True)
        with contextlib.ExitStack() as batches:
            jobs = {KERNELS: EntryImport(store, batches.enter_context(publish_batch(store)), allowed_archs, path)}
            for section in SECTIONS:
                if listings[section.folder]:
                    section_store = section.store_of(root)
                    jobs[section.folder] = EntryImport(section_store, batches.enter_context(publish_batch(section_store)),
                                                       allowed_archs, path, section.folder, section.check_bound)
            staging_started = time.perf_counter()
            fates = _verify_and_stage_all(reader, listings, jobs)
            report.stage_seconds = time.perf_counter() - staging_started
            # Every entry of the bundle is verified and every wanted one staged: only now is any visible,
            # and then all of them: a SIGINT or SIGTERM waits for the last rename.
            outcomes: dict[str, dict[str, PublishOutcome]] = {}
            try:
                with signals_deferred():
                    for folder, job in jobs.items():
                        outcomes[folder] = job.batch.publish()
            except Interrupted as stop:
                if len(outcomes) == len(jobs):  # published whole, then interrupted: say what it did
                    _count_all(report, fates, outcomes, listings)
                    stop.done = (f"its renames were under way, and finished first: imported {report.imported} "
                                 f"entries into {root}, {report.already_present} already there")
                raise
            report.publish_seconds = time.perf_counter() - staging_started - report.stage_seconds
    _count_all(report, fates, outcomes, listings)
    report.seconds = time.perf_counter() - started
    return report


def _count_all(report: ImportReport, fates: dict[str, dict[str, EntryFate]],
               outcomes: dict[str, dict[str, PublishOutcome]], listings: dict[str, dict[str, Any]]) -> None:
    """The report's counts, of every section: `report.triton` and `report.helion` are theirs."""
    for folder, folder_outcomes in outcomes.items():
        imported_before = report.imported
        _count_outcomes(report, fates.get(folder, {}), folder_outcomes, listings[folder])
        if folder != KERNELS:
            setattr(report, folder, report.imported - imported_before)


def _count_outcomes(report: ImportReport, fates: dict[str, EntryFate], outcomes: dict[str, PublishOutcome],
                    entries: dict[str, Any]) -> None:
    report.filtered_out += sum(fate is EntryFate.FILTERED_OUT for fate in fates.values())
    report.already_present += sum(fate is EntryFate.ALREADY_PRESENT for fate in fates.values())
    for key, outcome in outcomes.items():
        if outcome is PublishOutcome.PUBLISHED:
            report.imported += 1
            report.bytes += sum(size for size, _digest in entries[key]["files"].values())
        else:  # another importer published it meanwhile
            report.already_present += 1


def _verify_and_stage_all(reader: BundleReader, listings: dict[str, dict[str, Any]], jobs: dict[str, EntryImport],
                          ) -> dict[str, dict[str, EntryFate]]:
    """Read the archive's headers in order, once, in this thread, and have each entry verified and
    staged as soon as its last member is reached: the kernels in stager processes for a large bundle
    (kcache.bundle.stager, handed the bundle's descriptor), else in threads (`_ThreadStaging`);
    each section's entries (`jobs` beside KERNELS: small groups, picks) always in threads. The fates
    of each, by folder.
    Each member's size must be the one the manifest lists before a byte of it is read, and an entry's
    files must lie together, so memory stays bounded (by the manifest's sizes) whatever the archive's
    headers claim. The first failure stops the reading and is raised once every worker has stopped."""
    path = jobs[KERNELS].path
    entries = listings[KERNELS]
    expected = {f"{folder}/{key}/{component}": (folder, key, component)
                for folder, listed in listings.items() for key, entry in listed.items() for component in entry["files"]}
    processes = stager_count(len(entries), sum(size for entry in entries.values()
                                               for size, _digest in entry["files"].values()))
    stagings: dict[str, ProcessStaging | _ThreadStaging] = {}
    collecting: tuple[str, str] | None = None  # the entry whose members are being reached
    members: dict[str, BundleMember] = {}
    try:
        kernels = jobs[KERNELS]
        stagings[KERNELS] = ProcessStaging(kernels, processes, reader.fd) if processes else _ThreadStaging(kernels, reader)
        for folder, job in jobs.items():
            if folder != KERNELS:
                stagings[folder] = _ThreadStaging(job, reader)
        for member in reader:
            if member.name not in expected:
                raise BundleError(str(path), f"it holds a member its manifest does not list: {member.name!r}")
            folder, key, component = expected[member.name]
            if collecting not in (None, (folder, key)):
                raise BundleError(str(path), f"{member.name} comes before every file of {'/'.join(collecting)} "
                                  "was read: a bundle holds each entry's files together")
            entry = listings[folder][key]
            listed = entry["files"][component][0]  # at most MAX_ENTRY_FILE_BYTES (parse_manifest)
            if member.size != listed:
                raise BundleError(str(path), f"{member.name} is {member.size} bytes in the archive, but its "
                                  f"manifest lists {listed}: the bundle was changed after it was exported; export "
                                  "it again")
            collecting = (folder, key)
            members[component] = member
            if len(members) == len(entry["files"]):
                stagings[folder].submit(key, entry, {name: (m.offset, m.size) for name, m in members.items()})
                collecting, members = None, {}
        missing = sorted(set(expected) - reader.seen)
        if missing:
            raise BundleError(str(path), f"{len(missing)} file(s) its manifest lists are missing, e.g. {missing[0]!r}")
        return {folder: staging.finish() for folder, staging in stagings.items()}
    except BaseException:
        for staging in stagings.values():
            staging.abort()
        raise


class _ThreadStaging:
    """Entries verified and staged in threads (hashing, writing and reading back release the GIL),
    their bytes read here; at most IN_FLIGHT_PER_WORKER entries per worker wait or run."""

    def __init__(self, job: EntryImport, reader: BundleReader) -> None:
        self._job = job
        self._reader = reader
        self._workers = min(MAX_IMPORT_WORKERS, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="kcache-import")
        self._in_flight: deque[tuple[str, Future[EntryFate]]] = deque()
        self._fates: dict[str, EntryFate] = {}

    def submit(self, key: str, entry: dict[str, Any], offsets: dict[str, tuple[int, int]]) -> None:
        files = {name: self._reader.read_at(name, offset, size, key) for name, (offset, size) in offsets.items()}
        self._in_flight.append((key, self._pool.submit(self._job.verify_and_stage, key, entry, files)))
        while len(self._in_flight) >= self._workers * IN_FLIGHT_PER_WORKER:
            self._settle_oldest()

    def finish(self) -> dict[str, EntryFate]:
        while self._in_flight:
            self._settle_oldest()
        self._pool.shutdown()
        return self._fates

    def abort(self) -> None:
        for _key, future in self._in_flight:
            future.cancel()  # those not started; shutdown waits for those running
        self._pool.shutdown()

    def _settle_oldest(self) -> None:
        done_key, future = self._in_flight.popleft()
        self._fates[done_key] = future.result()


