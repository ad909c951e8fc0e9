"""Deployment bundles: a root's kernel entries in one signed file, imported whole or not at all.

A bundle is an uncompressed tar (entries are mostly compiled code; import speed matters more than
size) of, in this order:

    kcache-bundle.json           the bundle manifest: format, toolchains, archs, and every entry's
                                 files with their sizes and sha256
    kcache-bundle.sig            HMAC-SHA256 of the manifest with KCACHE_BUNDLE_SECRET (when set)
    kernels/<key>/<component>    each entry's files, manifest.json included

Import trusts nothing in the file but what the signature covers: member names must be exactly
those the manifest lists (no `..`, no absolute path, no link or device, no duplicate), every file
must match its size and sha256, every entry must hold exactly a kernel entry's components and its
meta.json must name its key. The file is read once, in order (the manifest first, each entry's files
together); each entry is verified and staged in a worker thread as soon as it is read, and only once
the whole bundle is verified and staged are the entries renamed into place, in one batch of the
store's protocol (`EntryStore.publish_batch`: one syncfs, then the renames), so a reader, a second
importer or a crash never sees half an entry, and a refused bundle leaves nothing. Unsigned bundles
import only when asked (`allow_unsigned`), since whoever wrote one is trusted with code.

Why HMAC and not Ed25519: the `cryptography` package is not a dependency, and a bundle goes from one
organisation's build to its own servers, which can share a secret as they share the remote tier's.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
import stat
import tarfile
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache.config import default_root
from kcache.errors import CorruptEntry
from kcache.store.components import COMPONENTS, KERNELS, META
from kcache.store.entries import EntryStore, PublishOutcome
from kcache.store.layout import is_key
from kcache.store.manifest import MANIFEST_NAME
from kcache.tools.bundle_entries import BundleError, EntryFate, EntryImport, read_exactly
from kcache.tools.bundle_stager import ProcessStaging, stager_count

log = logging.getLogger("kcache")

BUNDLE_FORMAT = 1
MANIFEST_MEMBER = "kcache-bundle.json"
SIGNATURE_MEMBER = "kcache-bundle.sig"
SIGNATURE_LABEL = b"kcache-bundle-v1\0"
ENTRY_FILES = COMPONENTS | {MANIFEST_NAME}
MAX_MANIFEST_BYTES = 256 << 20  # a bundle manifest is about 1 KB an entry
MAX_SIGNATURE_BYTES = 1024
MAX_ENTRY_FILE_BYTES = 1 << 30
# Import verifies and stages entries in threads (sha256, writes and reads release the GIL); a few
# entries per worker are read ahead, so a bundle's bytes are never all in memory at once. Four: on
# the 16-core H100 machine (2026-11-24, 2000 entries of 512 KB) 2, 4, 8 and 16 threads staged in
# 3.1, 2.9, 3.5 and 3.7-4.6 s: past four, the threads contend (the GIL for the Python part of each
# file, and the allocator for each file's bytes) more than they overlap.
MAX_IMPORT_WORKERS = 4
IN_FLIGHT_PER_WORKER = 2


@dataclass
class ExportReport:
    bundle: str
    entries: int = 0
    bytes: int = 0
    archs: list[str] = field(default_factory=list)
    signed: bool = False
    missing: list[str] = field(default_factory=list)  # asked-for keys this root does not hold
    skipped: list[str] = field(default_factory=list)  # entries that failed verification here


@dataclass
class ImportReport:
    bundle: str
    imported: int = 0
    already_present: int = 0
    filtered_out: int = 0  # entries of other archs (`archs=`)
    bytes: int = 0
    seconds: float = 0.0
    stage_seconds: float = 0.0  # reading, verifying and staging every entry (the checks included)
    publish_seconds: float = 0.0  # the one sync, the renames


FROM_ENVIRONMENT = "from KCACHE_BUNDLE_SECRET"  # the default of `secret=`
CURRENT_TOOLCHAIN: Any = object()  # the default of `toolchain=`: this machine's


def _secret(given: str | None) -> str | None:
    return (os.environ.get("KCACHE_BUNDLE_SECRET") or None) if given is FROM_ENVIRONMENT else (given or None)


def _sign(secret: str, manifest: bytes) -> bytes:
    return hmac.new(secret.encode(), SIGNATURE_LABEL + manifest, hashlib.sha256).hexdigest().encode()


def _arch_of(meta: dict[str, Any]) -> str:
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    return str(target.get("arch") or target.get("kind") or "?")


# ---------------------------------------------------------------- export


def export_bundle(bundle: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                  keys: Iterable[str] | None = None, archs: Iterable[str] | None = None, since: float | None = None,
                  secret: str | None = FROM_ENVIRONMENT) -> ExportReport:
    """Write the verified kernel entries of `root` (default: the default root; all of them, or those of
    `keys`, of `archs`, created at or after `since`, a time.time()) to the bundle file `bundle`,
    atomically (a temporary file beside it, renamed), signed with `secret` (default:
    KCACHE_BUNDLE_SECRET; None or empty: unsigned)."""
    bundle = Path(bundle)
    secret = _secret(secret)
    store = EntryStore(Path(root) if root is not None else default_root(), KERNELS, COMPONENTS, bind_key=True)
    wanted = set(keys) if keys is not None else None
    allowed_archs = set(archs) if archs is not None else None
    report = ExportReport(str(bundle), signed=bool(secret))
    present = set(store.keys())
    if wanted is not None:
        report.missing = sorted(wanted - present)
    chosen: dict[str, dict[str, bytes]] = {}
    listing: dict[str, Any] = {}
    toolchains: list[Any] = []
    for key in sorted(present if wanted is None else wanted & present):
        try:
            files = store.read_with_manifest(key)
            if files is None:
                continue
        except (CorruptEntry, OSError) as err:
            report.skipped.append(key)
            log.warning("kcache: not exporting %s: %s", key[:16], getattr(err, "reason", err))
            continue
        meta = json.loads(files[META])
        if allowed_archs is not None and _arch_of(meta) not in allowed_archs:
            continue
        if since is not None and not float(meta.get("created", 0)) >= since:
            continue
        chosen[key] = files
        if meta.get("toolchain") not in toolchains:
            toolchains.append(meta.get("toolchain"))
        listing[key] = {"kernel": meta.get("kernel"), "arch": _arch_of(meta),
                        "files": {name: [len(data), hashlib.sha256(data).hexdigest()]
                                  for name, data in sorted(files.items())}}
    report.entries = len(chosen)
    report.archs = sorted({entry["arch"] for entry in listing.values()})
    manifest_bytes = json.dumps({"format": BUNDLE_FORMAT, "created": time.time(), "toolchains": toolchains,
                                 "archs": report.archs, "entries": listing}, indent=1, sort_keys=True).encode()
    temporary = bundle.with_name(f".{bundle.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "xb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, MANIFEST_MEMBER, manifest_bytes)
            if secret:
                _add(tar, SIGNATURE_MEMBER, _sign(secret, manifest_bytes))
            for key, files in chosen.items():
                for name, data in sorted(files.items()):
                    _add(tar, f"{KERNELS}/{key}/{name}", data)
                    report.bytes += len(data)
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, bundle)
    except OSError as err:
        temporary.unlink(missing_ok=True)
        raise BundleError(str(bundle), f"cannot write it: {err.strerror or err}") from err
    return report


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.mtime = 0  # the bundle's bytes depend on the entries only
    tar.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------- import


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

    The file is read once: each entry, as soon as its files are read, is verified and staged in a
    worker thread (`EntryStore.publish_batch`); the staged entries are renamed into place only once
    the whole bundle is verified and staged, and are all removed when anything is refused."""
    started = time.perf_counter()
    path = Path(bundle)
    root = Path(root) if root is not None else default_root()
    secret = _secret(secret)
    if toolchain is CURRENT_TOOLCHAIN:
        from kcache.tilelang.fingerprint import toolchain_fingerprint

        toolchain = toolchain_fingerprint(root, persist=False)
    report = ImportReport(str(path))
    with _open_bundle(path) as reader:
        manifest_bytes = reader.read_manifest()
        signature = reader.read_signature()
        if secret:
            if signature is None:
                raise BundleError(str(path), "it is not signed, and KCACHE_BUNDLE_SECRET is set: refused")
            if not hmac.compare_digest(signature, _sign(secret, manifest_bytes)):
                raise BundleError(str(path), "its signature does not verify with KCACHE_BUNDLE_SECRET (another "
                                  "secret, or the bundle was changed after it was signed)")
        elif signature is not None:
            raise BundleError(str(path), "it is signed: set KCACHE_BUNDLE_SECRET to the secret it was signed with")
        elif not allow_unsigned:
            raise BundleError(str(path), "it is not signed: sign bundles with KCACHE_BUNDLE_SECRET at export, or "
                              "import with --unsigned if you trust whoever wrote it (a bundle holds code)")
        manifest = _parse_manifest(manifest_bytes, path)
        if toolchain is not None and manifest["toolchains"] != [toolchain]:
            raise BundleError(str(path), _toolchain_mismatch(manifest["toolchains"], toolchain))
        entries: dict[str, Any] = manifest["entries"]
        allowed_archs = set(archs) if archs is not None else None
        store = EntryStore(root, KERNELS, COMPONENTS, bind_key=True)
        with store.publish_batch() as batch:
            staging_started = time.perf_counter()
            fates = _verify_and_stage_all(reader, entries, EntryImport(store, batch, allowed_archs, path))
            report.stage_seconds = time.perf_counter() - staging_started
            # Every entry of the bundle is verified and every wanted one staged: only now is any visible.
            outcomes = batch.publish()
            report.publish_seconds = time.perf_counter() - staging_started - report.stage_seconds
    report.filtered_out = sum(fate is EntryFate.FILTERED_OUT for fate in fates.values())
    report.already_present = sum(fate is EntryFate.ALREADY_PRESENT for fate in fates.values())
    for key, outcome in outcomes.items():
        if outcome is PublishOutcome.PUBLISHED:
            report.imported += 1
            report.bytes += sum(size for size, _digest in entries[key]["files"].values())
        else:  # another importer published it meanwhile
            report.already_present += 1
    report.seconds = time.perf_counter() - started
    return report


def _verify_and_stage_all(reader: _BundleReader, entries: dict[str, Any], job: EntryImport) -> dict[str, EntryFate]:
    """Read the archive's members in order, once, in this thread (tarfile is not thread-safe), and
    have each entry verified and staged as soon as its last member is reached: in stager processes
    for a large bundle (kcache.tools.bundle_stager), else in threads (`_ThreadStaging`). An entry's
    files must lie together, so memory stays bounded whatever the bundle's size. The first failure
    stops the reading and is raised once every worker has stopped."""
    path = job.path
    expected = {f"{KERNELS}/{key}/{component}": (key, component)
                for key, entry in entries.items() for component in entry["files"]}
    processes = stager_count(len(entries), sum(size for entry in entries.values()
                                               for size, _digest in entry["files"].values()))
    staging: ProcessStaging | _ThreadStaging = (ProcessStaging(job, processes) if processes
                                                else _ThreadStaging(job, reader))
    collecting: str | None = None  # the entry whose members are being reached
    members: dict[str, tarfile.TarInfo] = {}
    try:
        for member in reader:
            if member.name not in expected:
                raise BundleError(str(path), f"it holds a member its manifest does not list: {member.name!r}")
            key, component = expected[member.name]
            if collecting not in (None, key):
                raise BundleError(str(path), f"{member.name} comes before every file of {KERNELS}/{collecting} "
                                  "was read: a bundle holds each entry's files together")
            if member.size > MAX_ENTRY_FILE_BYTES:
                raise BundleError(str(path), f"{member.name} is {member.size} bytes, more than a bundle's "
                                  f"{component} may be")
            collecting = key
            members[component] = member
            if len(members) == len(entries[key]["files"]):
                staging.submit(key, entries[key], {name: (m.offset_data, m.size) for name, m in members.items()})
                collecting, members = None, {}
        missing = sorted(set(expected) - reader.seen)
        if missing:
            raise BundleError(str(path), f"{len(missing)} file(s) its manifest lists are missing, e.g. {missing[0]!r}")
        return staging.finish()
    except BaseException:
        staging.abort()
        raise


class _ThreadStaging:
    """Entries verified and staged in threads (hashing, writing and reading back release the GIL),
    their bytes read here; at most IN_FLIGHT_PER_WORKER entries per worker wait or run."""

    def __init__(self, job: EntryImport, reader: _BundleReader) -> None:
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


class _BundleReader:
    """A bundle's members in archive order, each checked as it is reached: a regular file with a
    plain relative name, seen once. A link, a device, an absolute or `..` name or a duplicate refuses
    the bundle. tarfile parses the headers, in one thread; a member's bytes are read with one pread
    at the offset it found (a member is contiguous: sparse members are refused)."""

    def __init__(self, tar: tarfile.TarFile, fd: int, path: Path) -> None:
        self._members = iter(tar)
        self._fd = fd
        self._path = path
        self._put_back: tarfile.TarInfo | None = None
        self.seen: set[str] = set()

    def __iter__(self) -> Iterator[tarfile.TarInfo]:
        return self

    def __next__(self) -> tarfile.TarInfo:
        if self._put_back is not None:
            member, self._put_back = self._put_back, None
            return member
        member = next(self._members)
        name = member.name
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "" in parts or "." in parts:
            raise BundleError(str(self._path), f"member {name!r} is not a plain relative path")
        if not member.isreg() or member.issparse():
            raise BundleError(str(self._path), f"member {name!r} is not a regular file (a link or a device)")
        if name in self.seen:
            raise BundleError(str(self._path), f"member {name!r} appears twice")
        self.seen.add(name)
        return member

    def read_manifest(self) -> bytes:
        """The bundle manifest: the first member, always."""
        first = next(self, None)
        if first is None or first.name != MANIFEST_MEMBER:
            raise BundleError(str(self._path), f"its first member is not {MANIFEST_MEMBER}: not a kcache bundle")
        return self.read(first, MAX_MANIFEST_BYTES)

    def read_signature(self) -> bytes | None:
        """The signature, the member right after the manifest where the bundle is signed."""
        second = next(self, None)
        if second is not None and second.name == SIGNATURE_MEMBER:
            return self.read(second, MAX_SIGNATURE_BYTES)
        self._put_back = second
        return None

    def read(self, member: tarfile.TarInfo, cap: int) -> bytes:
        name = member.name
        if member.size > cap:
            raise BundleError(str(self._path), f"{name} is {member.size} bytes, more than a bundle's "
                              f"{name.rsplit('/', 1)[-1]} may be")
        return self.read_at(name, member.offset_data, member.size)

    def read_at(self, name: str, offset: int, size: int, key: str | None = None) -> bytes:
        return read_exactly(self._fd, offset, size, self._path, f"{KERNELS}/{key}/{name}" if key is not None else name)


@contextmanager
def _open_bundle(path: Path) -> Iterator[_BundleReader]:
    """The bundle's members, read as they come (`_BundleReader`); a file that is not a whole tar
    archive is a BundleError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise BundleError(str(path), f"cannot open it: {err.strerror or err}") from err
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
            raise BundleError(str(path), "not a regular file")
        try:
            with tarfile.open(fileobj=raw, mode="r:") as tar:
                yield _BundleReader(tar, raw.fileno(), path)
        except (tarfile.TarError, EOFError) as err:
            raise BundleError(str(path), f"not a whole tar archive (truncated?): {err}") from err


def _parse_manifest(data: bytes, path: Path) -> dict[str, Any]:
    """The bundle manifest, every field of the expected type (it is signed, but may be unsigned)."""
    try:
        manifest = json.loads(data)
        if manifest.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"bundle format {manifest.get('format')!r}; this kcache reads {BUNDLE_FORMAT}")
        if not isinstance(manifest.get("toolchains"), list) or not isinstance(manifest.get("entries"), dict):
            raise ValueError("no toolchains or entries")
        for key, entry in manifest["entries"].items():
            if not is_key(key):
                raise ValueError(f"{key!r} is not a cache key")
            files = entry["files"]
            if set(files) != ENTRY_FILES:
                raise ValueError(f"entry {key[:16]} lists {sorted(files)}, not a kernel entry's files")
            for size, digest in files.values():
                if not (isinstance(size, int) and size >= 0 and isinstance(digest, str) and len(digest) == 64):
                    raise ValueError(f"entry {key[:16]} has a bad size or sha256")
            if not isinstance(entry.get("arch"), str):
                raise ValueError(f"entry {key[:16]} names no arch")
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise BundleError(str(path), f"its manifest is not a kcache bundle manifest: {err}") from None
    return manifest


def _toolchain_mismatch(theirs: list[Any], ours: Any) -> str:
    if len(theirs) != 1 or not isinstance(theirs[0], dict) or not isinstance(ours, dict):
        return f"it was built by {len(theirs)} toolchains, and this machine's is another; export it again here"
    differ = [f"{name}: bundle {theirs[0].get(name)!r}, here {ours.get(name)!r}"
              for name in sorted(set(theirs[0]) | set(ours)) if theirs[0].get(name) != ours.get(name)]
    return ("it was built by another toolchain, so none of its entries would be hit here ("
            + "; ".join(differ[:4]) + "). Build the bundle where the toolchain matches.")


def read_key_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The keys of a file, as records {"key", "kernel", "target"}: one key per line, or JSON lines with
    a "key" (what KCACHE_RECORD writes). Each key once, in the file's order."""
    records: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            record = json.loads(line) if line.startswith("{") else {"key": line}
        except ValueError:
            record = {}
        key = record.get("key") if isinstance(record, dict) else None
        if not isinstance(key, str) or not is_key(key):
            raise ValueError(f"{path}:{number}: {line[:80]!r} is not a cache key (64 hex digits, or a JSON line "
                             'with a "key")')
        records.setdefault(key, record)
    return list(records.values())


def read_key_list(path: str | os.PathLike[str]) -> list[str]:
    return [record["key"] for record in read_key_records(path)]


def bundle_keys(bundle: str | os.PathLike[str]) -> dict[str, str]:
    """The keys a bundle holds, with their archs, from its manifest (checked in form, not in content:
    `import_bundle` verifies the rest)."""
    path = Path(bundle)
    with _open_bundle(path) as reader:
        manifest = _parse_manifest(reader.read_manifest(), path)
    return {key: entry["arch"] for key, entry in manifest["entries"].items()}


def missing_coverage(records: list[dict[str, Any]], *, bundle: str | os.PathLike[str] | None = None,
                     root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The records whose key is in neither `bundle` nor `root` (one of them, at least, is given): what
    would compile."""
    held: set[str] = set()
    if bundle is not None:
        held |= set(bundle_keys(bundle))
    if root is not None:
        held |= set(EntryStore(Path(root), KERNELS, COMPONENTS, bind_key=True).keys())
    return [record for record in records if record["key"] not in held]
