"""The object-storage tier: one S3-compatible bucket shared by a fleet, with no server of kcache's own.

Layout under `s3://bucket/prefix` (an action cache over content-addressed blobs, as bazel-remote):

    <prefix>/blobs/<sha256>                       every file of every entry, stored once by content
    <prefix>/<format>/<toolchain>/entries/<key>   the entry's manifest: names, sizes, sha256s, and
                                                  meta.json itself (it names the key); signed
    <prefix>/<format>/<toolchain>/leases/<key>    a compile lease, where no Redis holds leases

The entry's own manifest.json is not stored: a reader makes it from the manifest's listing.

Publish: upload the blobs (each skipped when the bucket has it at its size), then write the manifest
create-only (`If-None-Match: *`). That write is the one publish point, as the rename is on disk: a
manifest is whole or absent, and the first writer wins; a later writer checks the winner's manifest
and leaves it (the same key compiles the same way), or replaces it only where it does not verify
or its blobs failed for this writer, and only the very version it read (`If-Match`). A writer killed between its blobs and its manifest
leaves blobs nobody lists: harmless, and the bucket's lifecycle rule removes them.

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

import datetime
import hashlib
import hmac
import json
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from kcache.errors import CorruptEntry
from kcache.store.entries import check_bound_key
from kcache.store.manifest import MANIFEST_NAME, format_manifest, verify_contents
from kcache.tiers.remote_guard import CircuitBreaker, RemoteCorrupt, bound_mac

log = logging.getLogger("kcache")

ENTRY_FORMAT = "kcache-s3-entry-1"
LEASE_FORMAT = "kcache-s3-lease-1"
# A manifest lists a handful of files: anything far bigger is not one of ours (not downloaded).
MAX_MANIFEST_BYTES = 64 << 10
MAX_LEASE_BYTES = 4 << 10
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_RETRY_AFTER_S = 30.0
DEFAULT_OPERATION_TIMEOUT_S = 10.0
DEFAULT_LEASE_S = 30.0
DEFAULT_MAX_ENTRY_BYTES = 64 << 20
# Slack for the clocks of different nodes when a lease's expiry (wall-clock time) is judged.
LEASE_SKEW_S = 10.0
BLOB_THREADS = 8
# Stored inside the entry's manifest, not as blobs: meta.json names the key, so no two entries share
# it, and reading it inline saves a request per hit. It is JSON text.
INLINE_FILES = frozenset({"meta.json"})
Parsed = tuple[list[tuple[str, int, str]], dict[str, bytes]]  # a manifest's listing, and its inline files

ABSENT = object()  # an object the bucket does not have


class S3UrlError(ValueError):
    """A KCACHE_REMOTE entry that is no usable s3:// URL; the message says what is wrong."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket[/prefix]`."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise S3UrlError(f"{url!r} is not s3://BUCKET[/PREFIX] (the endpoint, region and credentials come from "
                         "AWS_ENDPOINT_URL, AWS_REGION and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
    return parts.netloc, parts.path.strip("/")


_stores: dict[tuple[str, ...], Any] = {}
_stores_lock = threading.Lock()


def open_bucket(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """An obstore S3Store for `url`, configured the standard way: AWS_* variables (obstore reads them,
    and the instance's or container's credentials where none are set). An http:// endpoint (a local
    MinIO or moto) is allowed explicitly; requests are not retried, so a store that is down costs one
    timeout, and the circuit breaker then leaves it alone.

    One store per URL and configuration in a process: making one costs ~14 ms (its HTTP client), and
    its connections are reused by every cache of the process."""
    identity = (url, str(timeout_s), *(os.environ.get(name, "") for name in _CONFIG_VARIABLES))
    with _stores_lock:
        store = _stores.get(identity)
        if store is None:
            store = _stores[identity] = _new_store(url, timeout_s)
    return store


# What a store is made from (obstore reads the credentials itself): another value, another store.
_CONFIG_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                     "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def _new_store(url: str, timeout_s: float) -> Any:
    from obstore.store import S3Store

    bucket, prefix = parse_s3_url(url)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {
        "timeout": datetime.timedelta(seconds=timeout_s),
        "connect_timeout": datetime.timedelta(seconds=min(timeout_s, 1.0)),
    }
    config: dict[str, Any] = {}
    if endpoint:
        config["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["allow_http"] = True
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        config["region"] = region
    return S3Store(bucket, prefix=prefix or None, config=config, client_options=options,
                   retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=timeout_s)})


def _obstore() -> Any:
    """obstore, imported on first use: never by a hit that stops at the local disk."""
    import obstore
    import obstore.exceptions

    return obstore


def _exists_errors() -> tuple[type[BaseException], ...]:
    """What a create-only write raises when the object exists."""
    return (FileExistsError, _obstore().exceptions.AlreadyExistsError)


def _changed_errors() -> tuple[type[BaseException], ...]:
    """What a write of one version (`If-Match`) raises when the object is another version, or gone."""
    errors = _obstore().exceptions
    return (FileExistsError, FileNotFoundError, errors.AlreadyExistsError, errors.PreconditionError, errors.NotFoundError)


def _missing_errors() -> tuple[type[BaseException], ...]:
    return (FileNotFoundError, _obstore().exceptions.NotFoundError)


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


class BucketCheckFailed(RuntimeError):
    """`check_bucket` found the bucket unusable; the message says which step failed and why."""


def check_bucket(url: str) -> str:
    """What `kcache doctor` checks of an S3 tier: the bucket answers, these credentials can write, read
    and delete, and a create-only write of an existing object is refused (without that, two nodes
    could both publish one entry); returns a line with the latency. The probe object goes under
    `<prefix>/doctor/` and is deleted."""
    obstore = _obstore()
    store = open_bucket(url)
    probe = f"doctor/{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    step = "write"
    try:
        started = time.monotonic()
        obstore.put(store, probe, b"kcache doctor", mode="create")
        wrote = time.monotonic() - started
        step = "read"
        started = time.monotonic()
        if bytes(obstore.get(store, probe).bytes()) != b"kcache doctor":
            raise BucketCheckFailed(f"{url}: the probe object {probe} read back different bytes")
        read = time.monotonic() - started
        step = "create-only write"
        try:
            obstore.put(store, probe, b"again", mode="create")
        except _exists_errors():
            pass
        else:
            raise BucketCheckFailed(f"{url}: a create-only write (If-None-Match: *) replaced an existing object; "
                                    "this store cannot make one writer win, so kcache cannot publish entries in it")
        step = "delete"
        obstore.delete(store, probe)
    except BucketCheckFailed:
        raise
    except Exception as err:  # noqa: BLE001 - whatever the store answered, as one line
        raise BucketCheckFailed(f"{url}: the {step} of a probe object failed ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''})") from None
    return f"{url} answers: write {wrote * 1e3:.1f} ms, read {read * 1e3:.1f} ms, create-only writes refused when the object exists"


class S3Tier:
    """Entries of one namespace (entry format and toolchain) in one bucket and prefix."""

    name = "s3"

    def __init__(self, url: str, namespace: str, required: frozenset[str], *, secret: str | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retry_after_s: float = DEFAULT_RETRY_AFTER_S,
                 operation_timeout_s: float = DEFAULT_OPERATION_TIMEOUT_S, store: Any = None) -> None:
        self.url = url
        self.required = frozenset(required)
        self.secret = secret.encode() if secret else None
        self.max_entry_bytes = max_entry_bytes
        self._space = namespace.replace(":", "/")
        self._store = store if store is not None else open_bucket(url, timeout_s)
        self._breaker = CircuitBreaker(url, operation_timeout_s, retry_after_s)
        self._threads = ThreadPoolExecutor(BLOB_THREADS, thread_name_prefix="kcache-s3")
        self._bad_blobs: set[str] = set()  # found corrupt here: the next upload rewrites them
        self._refused: dict[str, str] = {}  # key -> e_tag of a manifest whose files did not verify here
        self._bad_lock = threading.Lock()

    # ------------------------------------------------------------ names

    def entry_name(self, key: str) -> str:
        return f"{self._space}/entries/{key}"

    def lease_name(self, key: str) -> str:
        return f"{self._space}/leases/{key}"

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
            log.warning("kcache: ignoring remote entry %s in %s: %s; it is recompiled and replaced",
                        self.entry_name(key), self.url, found)
            return None
        return found

    def put(self, key: str, files: dict[str, bytes]) -> bool:
        """Blobs first, then the manifest create-only; True if the bucket holds a verifying entry of
        `key` afterwards (ours, or the first writer's)."""
        if sum(len(data) for data in files.values()) > self.max_entry_bytes:
            log.debug("kcache: %s is over KCACHE_REMOTE_MAX_ENTRY: not uploaded", key)
            return False
        try:
            for name in INLINE_FILES & set(files):
                files[name].decode()
        except UnicodeDecodeError:
            log.debug("kcache: %s has a meta.json that is no text: not uploaded", key)
            return False
        return bool(self._breaker.call(lambda: self._publish(key, files), failed=False))

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
            verify_contents("remote entry", files, self.required)  # exactly the kind's components, each as listed
            check_bound_key("remote entry", files, key)
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
            listing = self._parse_manifest(key, body)
        except RemoteCorrupt as corrupt:
            corrupt.e_tag = e_tag  # type: ignore[attr-defined]
            return corrupt
        return listing, e_tag

    def _parse_manifest(self, key: str, body: bytes) -> Parsed:
        try:
            document = json.loads(body)
            if not isinstance(document, dict):
                raise RemoteCorrupt("not a kcache entry manifest")
            signature = document.pop("mac", None)
            if self.secret and not (isinstance(signature, str) and hmac.compare_digest(
                    signature, bound_mac(self.secret, self.entry_name(key), _canonical(document)).hex())):
                raise RemoteCorrupt("its signature does not verify with KCACHE_REMOTE_SECRET for this key (unsigned, "
                                    "another secret, or a manifest copied from another key)")
            if document.get("format") != ENTRY_FORMAT:
                raise RemoteCorrupt(f"not a kcache entry manifest (format {document.get('format')!r})")
            if document.get("key") != key:
                raise RemoteCorrupt(f"it names the key {str(document.get('key'))[:16]!r}, not this one")
            listing: list[tuple[str, int, str]] = []
            for item in document["files"]:
                name, size, digest = item
                if not (isinstance(name, str) and isinstance(size, int) and size >= 0 and isinstance(digest, str)
                        and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
                    raise RemoteCorrupt(f"bad file entry {item!r}")
                listing.append((name, size, digest))
            inline = {name: text.encode() for name, text in document.get("inline", {}).items()}
        except RemoteCorrupt:
            raise
        except Exception as err:  # any parse failure of untrusted bytes is a refused manifest, never a crash
            raise RemoteCorrupt(f"unreadable manifest: {type(err).__name__}: {err}") from None
        names = [name for name, _, _ in listing]
        if len(set(names)) != len(names) or set(names) != self.required:
            raise RemoteCorrupt(f"it lists {sorted(names)}, not the entry's components {sorted(self.required)}")
        if not set(inline) <= INLINE_FILES & self.required:
            raise RemoteCorrupt(f"it holds {sorted(inline)} inline, where only {sorted(INLINE_FILES)} may be")
        if sum(size for _, size, _ in listing) > self.max_entry_bytes:
            raise RemoteCorrupt(f"its files add up to more than the {self.max_entry_bytes} bytes of "
                                "KCACHE_REMOTE_MAX_ENTRY (not downloaded)")
        return listing, inline

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
        (or, with `exact`, not `limit`): checked on the reply's headers, before the body is read."""
        obstore = _obstore()
        try:
            result = obstore.get(self._store, name)
        except _missing_errors():
            return ABSENT
        size = result.meta["size"]
        if size > limit or (exact and size != limit):
            return RemoteCorrupt(f"{name} is {size} bytes, {'not' if exact else 'over'} the {limit} expected "
                                 "(not downloaded)")
        return bytes(result.bytes()), str(result.meta.get("e_tag") or "")

    def _publish(self, key: str, files: dict[str, bytes]) -> bool:
        # The entry's own manifest.json is not stored: the bucket's manifest lists the same sizes and
        # sha256s, and a reader makes manifest.json from it.
        components = {name: data for name, data in files.items() if name != MANIFEST_NAME}
        return self._write_manifest(key, self._upload_blobs(components), components)

    def _upload_blobs(self, files: dict[str, bytes]) -> list[tuple[str, int, str]]:
        """Every file but the inline ones as a blob (skipped where the bucket has it); the listing of all."""
        listing = sorted((name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items())
        by_digest = {digest: files[name] for name, _, digest in listing if name not in INLINE_FILES}
        list(self._threads.map(lambda item: self._upload_blob(*item), by_digest.items()))
        return listing

    def _write_manifest(self, key: str, listing: list[tuple[str, int, str]], files: dict[str, bytes]) -> bool:
        """The publish point: the manifest, create-only, after every blob it lists is stored."""
        obstore = _obstore()
        document: dict[str, Any] = {"format": ENTRY_FORMAT, "key": key, "files": [list(item) for item in listing],
                                    "inline": {name: files[name].decode() for name in sorted(INLINE_FILES & set(files))}}
        if self.secret:
            document["mac"] = bound_mac(self.secret, self.entry_name(key), _canonical(document)).hex()
        body = _canonical(document)
        try:
            obstore.put(self._store, self.entry_name(key), body, mode="create")  # the publish point
            return True
        except _exists_errors():
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
        else:
            return True  # the first writer's entry stands; ours, of the same key, is not needed
        try:
            obstore.put(self._store, self.entry_name(key), body, mode={"e_tag": e_tag})  # only that version
        except _changed_errors():
            return False  # replaced by another writer meanwhile
        log.warning("kcache: replaced the remote entry %s in %s, which did not verify: %s", self.entry_name(key),
                    self.url, existing)
        return True

    def _upload_blob(self, digest: str, data: bytes) -> None:
        obstore = _obstore()
        with self._bad_lock:
            known_bad = digest in self._bad_blobs
        if not known_bad:
            try:
                if obstore.head(self._store, self.blob_name(digest))["size"] == len(data):
                    return  # stored once across entries: content-addressed
            except _missing_errors():
                pass
        obstore.put(self._store, self.blob_name(digest), data)  # the right bytes are the only right value
        with self._bad_lock:
            self._bad_blobs.discard(digest)

    def _mark_bad(self, digest: str) -> None:
        with self._bad_lock:
            self._bad_blobs.add(digest)

    # ------------------------------------------------------------ leases

    def try_lease(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> S3Lease | bool | None:
        """A lease on compiling `key` (renewed until released); False if another node holds it; None if
        the store is unavailable. Taken create-only, or, over a stale or invalid lease, by replacing
        exactly the version read (`If-Match`): of two nodes taking over one stale lease, one wins."""
        taken = self._breaker.call(lambda: self._take_lease(key, lease_s), failed=ABSENT)
        if taken is ABSENT:
            return None
        if not taken:
            return False
        token, e_tag = taken
        return S3Lease(self, key, token, lease_s, e_tag)

    def lease_held(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> bool | None:
        """Whether a node holds a valid compile lease of `key`; None if the store is unavailable."""
        found = self._breaker.call(lambda: self._read(self.lease_name(key), MAX_LEASE_BYTES), failed=ABSENT)
        if found is ABSENT and not self.available():
            return None
        if found is ABSENT or isinstance(found, RemoteCorrupt):
            return False
        body, _ = found
        return not self._lease_invalid(key, body, lease_s)

    def _take_lease(self, key: str, lease_s: float) -> tuple[str, str] | bool:
        obstore = _obstore()
        token = uuid.uuid4().hex
        body = self._lease_body(key, token, lease_s)
        try:
            return token, str(obstore.put(self._store, self.lease_name(key), body, mode="create")["e_tag"] or "")
        except _exists_errors():
            pass
        found = self._read(self.lease_name(key), MAX_LEASE_BYTES)
        if found is ABSENT or isinstance(found, RemoteCorrupt):
            return False  # released and gone, or planted oversized: the next attempt decides
        current, e_tag = found
        why = self._lease_invalid(key, current, lease_s)
        if not why:
            return False
        try:
            put = obstore.put(self._store, self.lease_name(key), body, mode={"e_tag": e_tag})
        except _changed_errors():
            return False  # another node took it over first
        if why != "released":
            log.warning("kcache: took over the compile lease %s in %s: %s", self.lease_name(key), self.url, why)
        return token, str(put["e_tag"] or "")

    def _lease_body(self, key: str, token: str, lease_s: float, *, released: bool = False) -> bytes:
        document: dict[str, Any] = {
            "format": LEASE_FORMAT, "token": token, "holder": f"{socket.gethostname()}:{os.getpid()}",
            "expires_ms": 0 if released else int((time.time() + lease_s) * 1000),
        }
        if self.secret:
            document["mac"] = bound_mac(self.secret, self.lease_name(key), _canonical(document)).hex()
        return _canonical(document)

    def _lease_invalid(self, key: str, body: bytes, lease_s: float) -> str:
        try:
            document = json.loads(body)
            signature = document.pop("mac", None)
            if self.secret and not (isinstance(signature, str) and hmac.compare_digest(
                    signature, bound_mac(self.secret, self.lease_name(key), _canonical(document)).hex())):
                return "its signature does not verify with KCACHE_REMOTE_SECRET"
            if document.get("format") != LEASE_FORMAT:
                return "not a kcache lease"
            expires = int(document["expires_ms"]) / 1000
        except (ValueError, KeyError, TypeError, AttributeError):
            return "not a kcache lease"
        if expires == 0:
            return "released"
        now = time.time()
        if expires < now - LEASE_SKEW_S:
            return f"it expired (its holder {document.get('holder')!r} stopped renewing it)"
        if expires > now + lease_s + LEASE_SKEW_S:
            return "it claims to last longer than a lease may"
        if _dead_here(document.get("holder")):
            return f"its holder {document.get('holder')!r} on this host is gone"
        return ""


def _dead_here(holder: object) -> bool:
    """Whether a lease's holder ("host:pid") is a process of this host that no longer exists: a rank
    killed mid-compile then costs its neighbours nothing, not a wait for its lease to lapse. A pid
    reused since reads as alive (a wait, as before); a holder in another pid namespace under the same
    host name may read as dead (a second compile of the key, never a wrong kernel)."""
    if not isinstance(holder, str) or holder.count(":") < 1:
        return False
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # another user's process: alive
    return False


class S3Lease:
    """A held compile lease object; a thread renews it (replacing exactly its own version) until
    `release()`, which writes it released, so that a waiting node takes it at once."""

    def __init__(self, tier: S3Tier, key: str, token: str, lease_s: float, e_tag: str) -> None:
        self.tier = tier
        self.key = key
        self.token = token
        self.lease_s = lease_s
        self.e_tag = e_tag
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="kcache-s3-lease", daemon=True)
        self._thread.start()

    def _replace(self, released: bool) -> None:
        obstore = _obstore()
        body = self.tier._lease_body(self.key, self.token, self.lease_s, released=released)
        try:
            put = obstore.put(self.tier._store, self.tier.lease_name(self.key), body, mode={"e_tag": self.e_tag})
        except _changed_errors():
            return  # it lapsed and another node holds it now: theirs stays
        self.e_tag = str(put["e_tag"] or "")

    def _keep(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            self.tier._breaker.call(lambda: self._replace(released=False))

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        self.tier._breaker.call(lambda: self._replace(released=True))
