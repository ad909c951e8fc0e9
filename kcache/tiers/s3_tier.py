"""The object-storage tier: one S3-compatible bucket shared by a fleet, with no server of kcache's own.

Layout under `s3://bucket/prefix` (an action cache over content-addressed blobs, as bazel-remote):

    <prefix>/blobs/<sha256>                       every file of every entry, stored once by content
    <prefix>/<format>/<toolchain>/entries/<key>   the entry's manifest: names, sizes, sha256s, and
                                                  meta.json itself (it names the key); signed
    <prefix>/<format>/<toolchain>/leases/<key>    a compile lease, where no Redis holds leases
                                                  (kcache/tiers/s3_lease.py)

The entry's own manifest.json is not stored: a reader makes it from the manifest's listing.

Publish: upload the blobs (each skipped when the bucket has it at its size), then write the manifest
create-only (`If-None-Match: *`). That write is the one publish point, as the rename is on disk: a
manifest is whole or absent, and the first writer wins; a later writer checks the winner's manifest
and leaves it (the same key compiles the same way), or replaces it only where it does not verify,
its blobs failed for this writer, or the writer is a forced re-tune (`put(replace=True)`), and only
the very version it read (`If-Match`). A writer killed between its blobs and its manifest leaves
blobs nobody lists: harmless, and the bucket's lifecycle rule removes them.

Read: the manifest (its size capped before a byte is read), its signature and the key it names, then
every blob, each checked against the manifest's size before it is read and its sha256 after; the
entry's own manifest.json and meta.json are checked as a Redis value's are. Nothing reaches the
local root unverified. A blob found corrupt is rewritten by the next upload of an entry that holds
it, even if the bucket reports it present.

`LIST` is never used: its consistency varies between S3-compatible stores, and nothing needs it.
The client is obstore (Rust's object_store): about 6 ms to import and no import at all on a hit path
that stops at the local disk.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kcache.errors import CorruptEntry
from kcache.redaction import masked
from kcache.store.entries import check_bound_key
from kcache.store.manifest import MANIFEST_NAME, format_manifest, verify_contents
from kcache.tiers.remote_guard import CircuitBreaker, RemoteCorrupt, warn_refused
from kcache.tiers.s3_bucket import (
    DEFAULT_TIMEOUT_S,
    changed_errors,
    exists_errors,
    missing_errors,
    obstore_module,
    open_bucket,
    read_capped,
)
from kcache.tiers.s3_lease import DEFAULT_LEASE_S, S3Lease, S3Leases
from kcache.tiers.s3_manifest import INLINE_FILES, MAX_MANIFEST_BYTES, Parsed, manifest_body, parse_manifest

log = logging.getLogger("kcache")

DEFAULT_RETRY_AFTER_S = 30.0
DEFAULT_OPERATION_TIMEOUT_S = 10.0
DEFAULT_MAX_ENTRY_BYTES = 64 << 20
BLOB_THREADS = 8

ABSENT = object()  # an object the bucket does not have


class S3Tier:
    """Entries of one namespace (entry format and toolchain) in one bucket and prefix."""

    name = "s3"

    def __init__(self, url: str, namespace: str, required: frozenset[str], *, secret: str | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retry_after_s: float = DEFAULT_RETRY_AFTER_S,
                 operation_timeout_s: float = DEFAULT_OPERATION_TIMEOUT_S, store: Any = None,
                 exact: bool = True, bound_meta: str = "meta.json") -> None:
        self.url = masked(url)  # what messages name: never a credential (the bucket opens from `url`)
        self.required = frozenset(required)
        self.exact = exact  # the entry holds exactly `required` (False: at least; the kind checks the rest)
        self.bound_meta = bound_meta  # the file that names the entry's key
        self.secret = secret.encode() if secret else None
        self.max_entry_bytes = max_entry_bytes
        self._space = namespace.replace(":", "/")
        self._store = store if store is not None else open_bucket(url, timeout_s)
        self._breaker = CircuitBreaker(self.url, operation_timeout_s, retry_after_s)
        self._threads = ThreadPoolExecutor(BLOB_THREADS, thread_name_prefix="kcache-s3")
        self._bad_blobs: set[str] = set()  # found corrupt here: the next upload rewrites them
        self._refused: dict[str, str] = {}  # key -> e_tag of a manifest whose files did not verify here
        self._bad_lock = threading.Lock()
        self._leases = S3Leases(self._store, self.url, self._space, self.secret, self._breaker)

    # ------------------------------------------------------------ names

    def entry_name(self, key: str) -> str:
        return f"{self._space}/entries/{key}"

    def lease_name(self, key: str) -> str:
        return self._leases.name(key)

    @staticmethod
    def blob_name(digest: str) -> str:
        return f"blobs/{digest}"

    # ------------------------------------------------------------ entries

    def available(self) -> bool:
        return self._breaker.available()

    def get(self, key: str) -> dict[str, bytes] | None:
        """The verified files of `key`, or None (absent, corrupt, refused, or the store unavailable)."""
        found = self._breaker.call(lambda: self._fetch(key))
        if found is None or found is ABSENT:
            return None
        if isinstance(found, RemoteCorrupt):
            warn_refused(self.url, self.entry_name(key), found)
            return None
        return found

    def put(self, key: str, files: dict[str, bytes], *, replace: bool = False) -> bool:
        """Blobs first, then the manifest create-only; True if the bucket holds a verifying entry of
        `key` afterwards (ours, or the first writer's). `replace=True` (a forced re-tune) replaces a
        verifying entry too: exactly the version read, so a writer that replaced it meanwhile wins."""
        if sum(len(data) for data in files.values()) > self.max_entry_bytes:
            log.debug("kcache: %s is over KCACHE_REMOTE_MAX_ENTRY: not uploaded", key)
            return False
        try:
            for name in INLINE_FILES & set(files):
                files[name].decode()
        except UnicodeDecodeError:
            log.debug("kcache: %s has a meta.json that is no text: not uploaded", key)
            return False
        return bool(self._breaker.call(lambda: self._publish(key, files, replace), failed=False))

    # ------------------------------------------------------------ entries: the store's side

    def _fetch(self, key: str) -> dict[str, bytes] | RemoteCorrupt | object:
        found = self._read_manifest(key)
        if found is ABSENT or isinstance(found, RemoteCorrupt):
            return found
        (listing, inline), e_tag = found
        fetched = [item for item in listing if item[0] not in inline]
        blobs = list(self._threads.map(lambda item: self._read_blob(item[2], item[1]), fetched))
        files: dict[str, bytes] = dict(inline)
        for (name, _size, _digest), blob in zip(fetched, blobs, strict=True):
            if isinstance(blob, RemoteCorrupt):
                return self._refuse(key, e_tag, blob)
            files[name] = blob
        # The entry's own manifest.json is this manifest's listing, as the store writes it.
        files[MANIFEST_NAME] = format_manifest({name: (size, digest) for name, size, digest in listing})
        try:
            verify_contents("remote entry", files, self.required, self.exact)  # the kind's components, each as listed
            check_bound_key("remote entry", files, key, self.bound_meta)
        except CorruptEntry as err:
            return self._refuse(key, e_tag, RemoteCorrupt(err.reason))
        return files

    def _refuse(self, key: str, e_tag: str, why: RemoteCorrupt) -> RemoteCorrupt:
        """An entry whose manifest reads well but whose files do not verify: the version this process
        saw is remembered, so that its next upload of `key` replaces exactly that version (a compile
        need not reproduce the bytes of a corrupt blob, so rewriting blobs alone may not mend it)."""
        with self._bad_lock:
            self._refused[key] = e_tag
        return why

    def _read_manifest(self, key: str) -> tuple[Parsed, str] | RemoteCorrupt | object:
        """((listing, inline files), e_tag) of the manifest of `key`; ABSENT; or RemoteCorrupt (with
        `.e_tag` set)."""
        found = self._read(self.entry_name(key), MAX_MANIFEST_BYTES)
        if found is ABSENT:
            return ABSENT
        if isinstance(found, RemoteCorrupt):
            return found
        body, e_tag = found
        try:
            listing = parse_manifest(body, key, self.entry_name(key), self.secret, self.required,
                                     self.max_entry_bytes, exact=self.exact)
        except RemoteCorrupt as corrupt:
            corrupt.e_tag = e_tag  # type: ignore[attr-defined]
            return corrupt
        return listing, e_tag

    def _read_blob(self, digest: str, size: int) -> bytes | RemoteCorrupt:
        found = self._read(self.blob_name(digest), size, exact=True)
        if found is ABSENT:
            return RemoteCorrupt(f"its blob {digest[:16]} is missing")
        if isinstance(found, RemoteCorrupt):
            self._mark_bad(digest)
            return found
        data, _ = found
        if hashlib.sha256(data).hexdigest() != digest:
            self._mark_bad(digest)
            return RemoteCorrupt(f"its blob {digest[:16]} does not match its sha256")
        return data

    def _read(self, name: str, limit: int, exact: bool = False) -> tuple[bytes, str] | RemoteCorrupt | object:
        """The bytes and e_tag of object `name`; ABSENT; RemoteCorrupt when its size is over `limit`
        (or, with `exact`, not `limit`): checked on the reply's headers, before the body is read. The
        refusal carries the version's `.e_tag`, so that an upload replaces exactly that version."""
        found = read_capped(self._store, name, limit, exact=exact)
        if found is None:
            return ABSENT
        if found.body is None:
            refused = RemoteCorrupt(f"{name} is {found.size} bytes, {'not' if exact else 'over'} the {limit} "
                                    "expected (not downloaded)")
            refused.e_tag = found.e_tag  # type: ignore[attr-defined]
            return refused
        return found.body, found.e_tag

    def _publish(self, key: str, files: dict[str, bytes], replace: bool = False) -> bool:
        # The entry's own manifest.json is not stored: the bucket's manifest lists the same sizes and
        # sha256s, and a reader makes manifest.json from it.
        components = {name: data for name, data in files.items() if name != MANIFEST_NAME}
        return self._write_manifest(key, self._upload_blobs(components), components, replace)

    def _upload_blobs(self, files: dict[str, bytes]) -> list[tuple[str, int, str]]:
        """Every file but the inline ones as a blob (skipped where the bucket has it); the listing of all."""
        listing = sorted((name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items())
        by_digest = {digest: files[name] for name, _, digest in listing if name not in INLINE_FILES}
        list(self._threads.map(lambda item: self._upload_blob(*item), by_digest.items()))
        return listing

    def _write_manifest(self, key: str, listing: list[tuple[str, int, str]], files: dict[str, bytes],
                        replace: bool = False) -> bool:
        """The publish point: the manifest, create-only, after every blob it lists is stored; over an
        existing one, only where it does not verify, or with `replace`."""
        obstore = obstore_module()
        body = manifest_body(key, self.entry_name(key), listing, files, self.secret)
        try:
            obstore.put(self._store, self.entry_name(key), body, mode="create")  # the publish point
            return True
        except exists_errors():
            pass  # another writer was first
        existing = self._read_manifest(key)
        if existing is ABSENT:
            return False  # deleted meanwhile (a lifecycle rule): the next upload writes it
        with self._bad_lock:
            refused = self._refused.pop(key, None)
        if isinstance(existing, RemoteCorrupt):
            e_tag = getattr(existing, "e_tag", "")
        elif existing[1] == refused:
            e_tag, existing = refused, RemoteCorrupt("its files did not verify when this node read it")
        elif replace:
            e_tag = existing[1]
        else:
            return True  # the first writer's entry stands; ours, of the same key, is not needed
        try:
            obstore.put(self._store, self.entry_name(key), body, mode={"e_tag": e_tag})  # only that version
        except changed_errors():
            return False  # replaced by another writer meanwhile
        if isinstance(existing, RemoteCorrupt):
            log.warning("kcache: replaced the remote entry %s in %s, which did not verify: %s", self.entry_name(key),
                        self.url, existing)
        else:
            log.info("kcache: replaced the remote entry %s in %s (a forced re-tune)", self.entry_name(key), self.url)
        return True

    def _upload_blob(self, digest: str, data: bytes) -> None:
        obstore = obstore_module()
        with self._bad_lock:
            known_bad = digest in self._bad_blobs
        if not known_bad:
            try:
                if obstore.head(self._store, self.blob_name(digest))["size"] == len(data):
                    return  # stored once across entries: content-addressed
            except missing_errors():
                pass
        obstore.put(self._store, self.blob_name(digest), data)  # the right bytes are the only right value
        with self._bad_lock:
            self._bad_blobs.discard(digest)

    def _mark_bad(self, digest: str) -> None:
        with self._bad_lock:
            self._bad_blobs.add(digest)

    # ------------------------------------------------------------ leases (kcache.tiers.s3_lease)

    def try_lease(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> S3Lease | bool | None:
        """A lease on compiling `key` (renewed until released); False if another node holds a valid one;
        None if the store is unavailable. One attempt: RemoteTiers.claim waits."""
        return self._leases.try_lease(key, lease_s)

    def lease_held(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> bool | None:
        """Whether a node holds a valid compile lease of `key`; None if the store is unavailable."""
        return self._leases.lease_held(key, lease_s)

    def _lease_body(self, key: str, token: str, lease_s: float) -> bytes:
        """A lease's body as this tier writes it (tests forge stale leases from it)."""
        return self._leases.body(key, token, lease_s)
