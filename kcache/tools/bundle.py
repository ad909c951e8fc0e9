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
meta.json must name its key. The whole bundle is verified before any entry is published; each entry
is then published with the store's protocol (staging, verify, one rename), so a reader, a second
importer or a crash never sees half an entry. Unsigned bundles import only when asked
(`allow_unsigned`), since whoever wrote one is trusted with code.

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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kcache.config import default_root
from kcache.errors import CorruptEntry, KCacheError
from kcache.store.components import COMPONENTS, KERNELS, META
from kcache.store.entries import EntryStore, PublishOutcome, check_bound_key
from kcache.store.layout import is_key
from kcache.store.manifest import MANIFEST_NAME

log = logging.getLogger("kcache")

BUNDLE_FORMAT = 1
MANIFEST_MEMBER = "kcache-bundle.json"
SIGNATURE_MEMBER = "kcache-bundle.sig"
SIGNATURE_LABEL = b"kcache-bundle-v1\0"
ENTRY_FILES = COMPONENTS | {MANIFEST_NAME}
MAX_MANIFEST_BYTES = 256 << 20  # a bundle manifest is about 1 KB an entry
MAX_ENTRY_FILE_BYTES = 1 << 30


class BundleError(KCacheError, ValueError):
    """A bundle that cannot be written or is refused; `path` and `reason` say which and why."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        self._init_args = (path, reason)
        super().__init__(f"bundle {path}: {reason}")


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
    None: no check) is refused, naming the fields that differ."""
    started = time.perf_counter()
    path = Path(bundle)
    root = Path(root) if root is not None else default_root()
    secret = _secret(secret)
    if toolchain is CURRENT_TOOLCHAIN:
        from kcache.tilelang.fingerprint import toolchain_fingerprint

        toolchain = toolchain_fingerprint(root, persist=False)
    report = ImportReport(str(path))
    with _open_bundle(path) as (tar, members):
        manifest_bytes = _read_member(tar, members, MANIFEST_MEMBER, MAX_MANIFEST_BYTES, path)
        signature = members.get(SIGNATURE_MEMBER)
        if secret:
            if signature is None:
                raise BundleError(str(path), "it is not signed, and KCACHE_BUNDLE_SECRET is set: refused")
            given = _read_member(tar, members, SIGNATURE_MEMBER, 1024, path)
            if not hmac.compare_digest(given, _sign(secret, manifest_bytes)):
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
        expected = {f"{KERNELS}/{key}/{name}": (key, name, tuple(spec))
                    for key, entry in entries.items() for name, spec in entry["files"].items()}
        extra = sorted(set(members) - set(expected) - {MANIFEST_MEMBER, SIGNATURE_MEMBER})
        if extra:
            raise BundleError(str(path), f"it holds {len(extra)} member(s) its manifest does not list, e.g. {extra[0]!r}")
        missing = sorted(set(expected) - set(members))
        if missing:
            raise BundleError(str(path), f"{len(missing)} file(s) its manifest lists are missing, e.g. {missing[0]!r}")
        # Pass 1: every byte against the signed manifest, and every entry's meta.json naming its key
        # (an entry moved under another key, manifest and all), before anything is visible.
        for name, (key, component, (size, digest)) in expected.items():
            data = _read_member(tar, members, name, MAX_ENTRY_FILE_BYTES, path)
            if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                raise BundleError(str(path), f"{name} does not match the bundle manifest (changed or swapped)")
            if component == META:
                _check_bound(key, data, path)
        allowed_archs = set(archs) if archs is not None else None
        store = EntryStore(root, KERNELS, COMPONENTS, bind_key=True)
        # Pass 2: publish each entry whole (its bytes checked again as they are written).
        for key in sorted(entries):
            entry = entries[key]
            if allowed_archs is not None and entry["arch"] not in allowed_archs:
                report.filtered_out += 1
                continue
            files = {component: _read_member(tar, members, f"{KERNELS}/{key}/{component}", MAX_ENTRY_FILE_BYTES, path)
                     for component in entry["files"]}
            for component, data in files.items():
                size, digest = entry["files"][component]
                if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                    raise BundleError(str(path), f"{KERNELS}/{key}/{component} changed while it was imported")
            outcome = _publish(store, key, files, path)
            if outcome is PublishOutcome.PUBLISHED:
                report.imported += 1
                report.bytes += sum(len(d) for d in files.values())
            else:
                report.already_present += 1
    report.seconds = time.perf_counter() - started
    return report


def _check_bound(key: str, meta: bytes, path: Path) -> None:
    try:
        check_bound_key(f"{path}: {KERNELS}/{key}", {META: meta}, key)
    except CorruptEntry as corrupt:
        raise BundleError(str(path), corrupt.reason) from None


def _publish(store: EntryStore, key: str, files: dict[str, bytes], path: Path) -> PublishOutcome:
    _check_bound(key, files[META], path)  # again: the bytes read now are the ones published
    if store.entry_path(key).is_dir():
        return PublishOutcome.LOST_RACE
    return store.publish_files(key, files)


@contextmanager
def _open_bundle(path: Path) -> Iterator[tuple[tarfile.TarFile, dict[str, tarfile.TarInfo]]]:
    """The bundle's tar and its members by name, each checked: a regular file with a plain relative
    name, listed once. A link, a device, an absolute or `..` name or a duplicate refuses the bundle."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise BundleError(str(path), f"cannot open it: {err.strerror or err}") from err
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
            raise BundleError(str(path), "not a regular file")
        try:
            with tarfile.open(fileobj=raw, mode="r:") as tar:
                members: dict[str, tarfile.TarInfo] = {}
                for member in tar.getmembers():
                    name = member.name
                    parts = name.split("/")
                    if name.startswith("/") or ".." in parts or "" in parts or "." in parts:
                        raise BundleError(str(path), f"member {name!r} is not a plain relative path")
                    if not member.isreg():
                        raise BundleError(str(path), f"member {name!r} is not a regular file (a link or a device)")
                    if name in members:
                        raise BundleError(str(path), f"member {name!r} appears twice")
                    members[name] = member
                if MANIFEST_MEMBER not in members:
                    raise BundleError(str(path), f"no {MANIFEST_MEMBER}: not a kcache bundle")
                yield tar, members
        except (tarfile.TarError, EOFError) as err:
            raise BundleError(str(path), f"not a whole tar archive (truncated?): {err}") from err


def _read_member(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str, cap: int, path: Path) -> bytes:
    member = members[name]
    if member.size > cap:
        raise BundleError(str(path), f"{name} is {member.size} bytes, more than a bundle's {name.rsplit('/', 1)[-1]} may be")
    source: IO[bytes] | None = tar.extractfile(member)
    data = source.read() if source is not None else b""
    if len(data) != member.size:
        raise BundleError(str(path), f"{name} is cut short: the archive is truncated")
    return data


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
    with _open_bundle(path) as (tar, members):
        manifest = _parse_manifest(_read_member(tar, members, MANIFEST_MEMBER, MAX_MANIFEST_BYTES, path), path)
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
