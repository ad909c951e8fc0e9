"""One S3-compatible bucket, as the S3 tier's entries and leases both use it: the store (obstore's
S3Store, configured the standard way), what its writes raise, reads whose size is checked before
the body is read, and the check `kcache doctor` runs.

obstore is imported on first use: never by a hit that stops at the local disk.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_TIMEOUT_S = 2.0


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
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_stores_lock=threading.Lock()))


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


def obstore_module() -> Any:
    """obstore, imported on first use: never by a hit that stops at the local disk."""
    import obstore
    import obstore.exceptions

    return obstore


def exists_errors() -> tuple[type[BaseException], ...]:
    """What a create-only write raises when the object exists."""
    return (FileExistsError, obstore_module().exceptions.AlreadyExistsError)


def changed_errors() -> tuple[type[BaseException], ...]:
    """What a write of one version (`If-Match`) raises when the object is another version, or gone."""
    errors = obstore_module().exceptions
    return (FileExistsError, FileNotFoundError, errors.AlreadyExistsError, errors.PreconditionError, errors.NotFoundError)


def missing_errors() -> tuple[type[BaseException], ...]:
    return (FileNotFoundError, obstore_module().exceptions.NotFoundError)


def canonical(document: dict[str, Any]) -> bytes:
    """The one byte form of a JSON document that kcache signs and stores."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class StoredObject:
    """One version of an object: its size and e_tag, and its bytes where they were within the limit
    of the read (None: not downloaded)."""

    size: int
    e_tag: str
    body: bytes | None


def read_capped(store: Any, name: str, limit: int, *, exact: bool = False) -> StoredObject | None:
    """Object `name` (None: absent). Its size comes with the reply's headers: an object over `limit`
    bytes (or, with `exact`, of another size) is never downloaded, so a planted multi-GB object costs
    the reader one small reply, not its memory."""
    obstore = obstore_module()
    try:
        result = obstore.get(store, name)
    except missing_errors():
        return None
    size = int(result.meta["size"])
    e_tag = str(result.meta.get("e_tag") or "")
    if size > limit or (exact and size != limit):
        return StoredObject(size, e_tag, None)
    return StoredObject(size, e_tag, bytes(result.bytes()))


class BucketCheckFailed(RuntimeError):
    """`check_bucket` found the bucket unusable; the message says which step failed and why."""


def check_bucket(url: str) -> str:
    """What `kcache doctor` checks of an S3 tier: the bucket answers, these credentials can write, read
    and delete, and a create-only write of an existing object is refused (without that, two nodes
    could both publish one entry); returns a line with the latency. The probe object goes under
    `<prefix>/doctor/` and is deleted."""
    obstore = obstore_module()
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
        except exists_errors():
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
