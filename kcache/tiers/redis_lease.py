"""Compile leases in Redis: `kcache:<namespace>:lease:<key>` holds "token.expires_ms[.hmac]", set NX
with a TTL and renewed while its holder compiles; when the holder dies the TTL frees it.

A lease is input from whoever can write to Redis, so it is read as an entry is
(kcache.tiers.redis_capped): its type and size are checked inside Redis before a byte is sent.
A lease that is no valid, signed, bounded one (a string without a TTL, a 200 MB string, a hash,
a forged expiry) is taken over by replacing exactly the value read: under WATCH, so a lease that
changed meanwhile is left to whoever changed it. Nothing planted there marks Redis down: every
script that touches a lease checks its type and length first.

One call is one attempt; the waiting, its deadline and its pauses are the caller's
(kcache.tiers.remote_chain.RemoteTiers.claim).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kcache.tiers.redis_capped import capped_value
from kcache.tiers.remote_guard import LEASE_SKEW_S, MAX_LEASE_BYTES, RemoteCorrupt, bound_mac

log = logging.getLogger("kcache")

DEFAULT_LEASE_S = 30.0
_FAILED = object()  # what a Redis command "returns" while Redis is unavailable

# Whether KEYS[1] holds exactly ARGV[1]; its type and length are checked before it is read, so a
# planted hash or huge string is "not ours" rather than a WRONGTYPE error or a copy of it.
_HOLDS = ("local function holds(key, value) "
          "if redis.call('type', key)['ok'] ~= 'string' then return false end "
          "if redis.call('strlen', key) ~= string.len(value) then return false end "
          "return redis.call('get', key) == value end ")
_RELEASE = _HOLDS + "if holds(KEYS[1], ARGV[1]) then return redis.call('del', KEYS[1]) end return 0"
_RENEW = _HOLDS + ("if holds(KEYS[1], ARGV[1]) then return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
                   "return 0")


class RedisLeases:
    """The compile leases of one namespace in one Redis. `call(operation, failed)` runs one command
    within the tier's circuit breaker; `capped_get` is the tier's capped read script."""

    def __init__(self, client: Any, prefix: str, url: str, secret: bytes | None,
                 call: Callable[..., Any], capped_get: Any) -> None:
        self.client = client
        self.prefix = prefix
        self.url = url
        self.secret = secret
        self.call = call
        self._capped_get = capped_get
        self.release_script = client.register_script(_RELEASE)
        self.renew_script = client.register_script(_RENEW)

    def name(self, key: str) -> str:
        return f"{self.prefix}lease:{key}"

    def try_lease(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> RedisLease | bool | None:
        """A lease on compiling `key` (renewed until released); False if another node holds a valid one;
        None if Redis is unavailable. One attempt."""
        token = uuid.uuid4().hex
        value = self.value(key, token, lease_s)
        taken = self.call(lambda: self._take(key, value, lease_s), failed=_FAILED)
        if taken is _FAILED:
            return None
        return RedisLease(self, key, token, lease_s, value) if taken else False

    def lease_held(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> bool | None:
        """Whether a node holds a valid compile lease of `key` (what try_lease would leave alone); None
        if Redis is unavailable."""
        found = self.call(lambda: self._read(self.client, key), failed=_FAILED)
        if found is _FAILED:
            return None
        return found is not None and not self.invalid(key, found, lease_s)

    def value(self, key: str, token: str, lease_s: float) -> bytes:
        body = f"{token}.{int((time.time() + lease_s) * 1000)}"
        if self.secret:
            body += "." + bound_mac(self.secret, self.name(key), body.encode()).hex()
        return body.encode()

    def invalid(self, key: str, found: bytes | RemoteCorrupt, lease_s: float) -> str:
        """Why the lease `found` may be taken over, or "" if it is valid. Never raises: a lease is input
        from whoever can write to Redis."""
        if isinstance(found, RemoteCorrupt):
            return str(found)
        try:
            parts = found.decode("ascii").split(".")
            body = ".".join(parts[:2])
            if self.secret and (len(parts) != 3 or not hmac.compare_digest(
                    parts[2], bound_mac(self.secret, self.name(key), body.encode()).hex())):
                return "its signature does not verify with KCACHE_REMOTE_SECRET"
            expires = int(parts[1]) / 1000
        except Exception:  # noqa: BLE001 - not text, no expiry, an expiry too big for a float...
            return "not a kcache lease"
        now = time.time()
        if expires < now - LEASE_SKEW_S:
            return "it expired (its holder stopped renewing it)"
        if expires > now + lease_s + LEASE_SKEW_S:
            return "it claims to last longer than a lease may"
        return ""

    def _read(self, client: Any, key: str) -> bytes | RemoteCorrupt | None:
        reply = self._capped_get(keys=[self.name(key)], args=[MAX_LEASE_BYTES], client=client)
        return capped_value(reply, f"the {MAX_LEASE_BYTES} of a lease")

    def _take(self, key: str, value: bytes, lease_s: float) -> bool:
        """SET NX; else, over a lease that is not valid, replace exactly the one read (WATCH)."""
        import redis

        name, lease_ms = self.name(key), int(lease_s * 1000)
        if self.client.set(name, value, nx=True, px=lease_ms):
            return True
        with self.client.pipeline() as watched:
            watched.watch(name)
            found = self._read(watched, key)  # under WATCH: any change from here on fails the EXEC
            why = "" if found is None else self.invalid(key, found, lease_s)
            if found is not None and not why:
                return False
            watched.multi()
            watched.set(name, value, px=lease_ms)
            try:
                watched.execute()
            except redis.WatchError:
                return False  # changed meanwhile: another node took it over, or its holder renewed it
        if why:
            log.warning("kcache: took over the invalid compile lease %s in %s: %s", name, self.url, why)
        return True


class RedisLease:
    """A held compile lease; a thread renews it (a new expiry, re-signed) until `release()`."""

    def __init__(self, leases: RedisLeases, key: str, token: str, lease_s: float, value: bytes) -> None:
        self.leases = leases
        self.key = key
        self.token = token
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self.value = value
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="kcache-lease", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        leases = self.leases
        while not self._stop.wait(self.lease_ms / 3000):
            renewed = leases.value(self.key, self.token, self.lease_s)
            if leases.call(lambda: leases.renew_script(keys=[leases.name(self.key)],
                                                       args=[self.value, renewed, self.lease_ms])):
                self.value = renewed

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        leases = self.leases
        leases.call(lambda: leases.release_script(keys=[leases.name(self.key)], args=[self.value]))
