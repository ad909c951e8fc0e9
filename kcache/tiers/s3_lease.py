"""Compile leases as objects of an S3 bucket, where no Redis holds them:
`<prefix>/<format>/<toolchain>/leases/<key>`, a small JSON document (token, holder, expiry; signed
with KCACHE_REMOTE_SECRET).

A lease is taken create-only (`If-None-Match: *`). Over a lease that is not valid, it is taken by
replacing exactly the version read (`If-Match`): of two nodes taking over one lease, one wins. A
lease is input from whoever can write to the bucket, so it is judged as an entry's manifest is:
its size first (from the reply's headers: an object over MAX_LEASE_BYTES is never downloaded),
then its signature, format and expiry. Whatever fails, the lease is invalid and taken over, never
"held" by one call and "not held" by another (that mismatch once left waiters polling in a loop),
and never an error that marks the bucket down.

One call is one attempt; the waiting, its deadline and its pauses are the caller's
(kcache.tiers.remote_chain.RemoteTiers.claim).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from kcache.tiers.remote_guard import LEASE_SKEW_S, MAX_LEASE_BYTES, CircuitBreaker, bound_mac
from kcache.tiers.s3_bucket import StoredObject, canonical, changed_errors, exists_errors, obstore_module, read_capped

log = logging.getLogger("kcache")

LEASE_FORMAT = "kcache-s3-lease-1"
DEFAULT_LEASE_S = 30.0
RELEASED = "released"

_FAILED = object()  # what a store operation "returns" while the store is unavailable


class S3Leases:
    """The compile leases of one namespace in one bucket."""

    def __init__(self, store: Any, url: str, space: str, secret: bytes | None, breaker: CircuitBreaker) -> None:
        self.store = store
        self.url = url
        self.secret = secret
        self.breaker = breaker
        self._space = space

    def name(self, key: str) -> str:
        return f"{self._space}/leases/{key}"

    def try_lease(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> S3Lease | bool | None:
        """A lease on compiling `key` (renewed until released); False if another node holds a valid one;
        None if the store is unavailable. One attempt."""
        taken = self.breaker.call(lambda: self._take(key, lease_s), failed=_FAILED)
        if taken is _FAILED:
            return None
        if not taken:
            return False
        token, e_tag = taken
        return S3Lease(self, key, token, lease_s, e_tag)

    def lease_held(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> bool | None:
        """Whether a node holds a valid compile lease of `key` (what try_lease would leave alone); None
        if the store is unavailable."""
        found = self.breaker.call(lambda: read_capped(self.store, self.name(key), MAX_LEASE_BYTES), failed=_FAILED)
        if found is _FAILED:
            return None
        return found is not None and not self.invalid(key, found, lease_s)

    def body(self, key: str, token: str, lease_s: float, *, released: bool = False) -> bytes:
        document: dict[str, Any] = {
            "format": LEASE_FORMAT, "token": token, "holder": f"{socket.gethostname()}:{os.getpid()}",
            "expires_ms": 0 if released else int((time.time() + lease_s) * 1000),
        }
        if self.secret:
            document["mac"] = bound_mac(self.secret, self.name(key), canonical(document)).hex()
        return canonical(document)

    def invalid(self, key: str, found: StoredObject, lease_s: float) -> str:
        """Why the lease `found` may be taken over ("released" for one its holder released), or "" if
        it is valid. Never raises: a lease is input from whoever can write to the bucket."""
        if found.body is None:
            return f"it is {found.size} bytes, over the {MAX_LEASE_BYTES} of a lease (not downloaded)"
        try:
            return self._judge(key, found.body, lease_s)
        except Exception as err:  # noqa: BLE001 - deep nesting (RecursionError), huge numbers (OverflowError)...
            return f"not a kcache lease ({type(err).__name__})"

    def _judge(self, key: str, body: bytes, lease_s: float) -> str:
        document = json.loads(body)
        if not isinstance(document, dict):
            return "not a kcache lease"
        signature = document.pop("mac", None)
        if self.secret and not (isinstance(signature, str) and hmac.compare_digest(
                signature, bound_mac(self.secret, self.name(key), canonical(document)).hex())):
            return "its signature does not verify with KCACHE_REMOTE_SECRET"
        if document.get("format") != LEASE_FORMAT:
            return "not a kcache lease"
        expires = int(document["expires_ms"]) / 1000
        if expires == 0:
            return RELEASED
        now = time.time()
        if expires < now - LEASE_SKEW_S:
            return f"it expired (its holder {document.get('holder')!r} stopped renewing it)"
        if expires > now + lease_s + LEASE_SKEW_S:
            return "it claims to last longer than a lease may"
        if _dead_here(document.get("holder")):
            return f"its holder {document.get('holder')!r} on this host is gone"
        return ""

    def _take(self, key: str, lease_s: float) -> tuple[str, str] | bool:
        """Create the lease, or replace exactly the invalid version read; (token, e_tag), or False."""
        obstore = obstore_module()
        token = uuid.uuid4().hex
        body = self.body(key, token, lease_s)
        try:
            return token, str(obstore.put(self.store, self.name(key), body, mode="create")["e_tag"] or "")
        except exists_errors():
            pass
        found = read_capped(self.store, self.name(key), MAX_LEASE_BYTES)
        if found is None:
            return False  # released and deleted meanwhile: the next attempt creates it
        why = self.invalid(key, found, lease_s)
        if not why:
            return False
        try:
            put = obstore.put(self.store, self.name(key), body, mode={"e_tag": found.e_tag})  # only that version
        except changed_errors():
            return False  # another node took it over first
        if why != RELEASED:
            log.warning("kcache: took over the compile lease %s in %s: %s", self.name(key), self.url, why)
        return token, str(put["e_tag"] or "")


def _dead_here(holder: object) -> bool:
    """Whether a lease's holder ("host:pid") is a process of this host that no longer exists: a rank
    killed mid-compile then costs its neighbours nothing, not a wait for its lease to lapse. A pid
    reused since reads as alive (a wait, as before); a holder in another pid namespace under the same
    host name may read as dead (a second compile of the key, never a wrong kernel)."""
    if not isinstance(holder, str) or holder.count(":") < 1:
        return False
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or len(pid) > 10 or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False  # another user's process (alive), or no pid at all
    return False


class S3Lease:
    """A held compile lease object; a thread renews it (replacing exactly its own version) until
    `release()`, which writes it released, so that a waiting node takes it at once."""

    def __init__(self, leases: S3Leases, key: str, token: str, lease_s: float, e_tag: str) -> None:
        self.leases = leases
        self.key = key
        self.token = token
        self.lease_s = lease_s
        self.e_tag = e_tag
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="kcache-s3-lease", daemon=True)
        self._thread.start()

    def _replace(self, released: bool) -> None:
        obstore = obstore_module()
        body = self.leases.body(self.key, self.token, self.lease_s, released=released)
        try:
            put = obstore.put(self.leases.store, self.leases.name(self.key), body, mode={"e_tag": self.e_tag})
        except changed_errors():
            return  # it lapsed and another node holds it now: theirs stays
        self.e_tag = str(put["e_tag"] or "")

    def _keep(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            self.leases.breaker.call(lambda: self._replace(released=False))

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        self.leases.breaker.call(lambda: self._replace(released=True))
