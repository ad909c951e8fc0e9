"""The Redis tier: one Redis shared by many machines, so that a cluster compiles each kernel once.

An entry travels as one Redis value (one SET: never a partial remote entry):

    b"KCR1" | 4-byte header length | header JSON {"files": [[name, size], ...]} | the files' bytes
    | 32-byte HMAC-SHA256, when KCACHE_REMOTE_SECRET is set, of the Redis key (namespace and cache
      key, length-prefixed) and everything before it: a value replayed under another key fails

A value is trusted by nothing but its content: names must be exactly the entry's components,
sizes must add up, every file must match the manifest inside (sizes and
sha256), meta.json must name the key asked for, and with a secret the HMAC must verify; any
failure to parse is a refused value with one warning. A remote hit is then
published into the local root through the ordinary staging protocol.

Single flight across machines: a lease (SET NX PX, kcache/tiers/redis_lease.py) renewed while its
holder compiles; when the holder dies the expiry frees it. Redis being down, slow
or restarted never stops kcache: short socket timeouts, one warning, and a
circuit breaker that leaves Redis alone for a while before trying again.
"""

from __future__ import annotations

import hmac
import json
import logging
import struct
from collections.abc import Callable
from typing import Any

from kcache.errors import CorruptEntry
from kcache.redaction import masked
from kcache.store.entries import check_bound_key
from kcache.store.manifest import verify_contents
from kcache.tiers.redis_capped import capped_value, register_capped_get
from kcache.tiers.redis_lease import DEFAULT_LEASE_S, RedisLease, RedisLeases
from kcache.tiers.remote_guard import DIGEST_SIZE, CircuitBreaker, RemoteCorrupt, bound_mac, warn_refused

log = logging.getLogger("kcache")

MAGIC = b"KCR1"
_LEN = struct.Struct(">I")
DEFAULT_TIMEOUT_S = 0.5
DEFAULT_RETRY_AFTER_S = 30.0
# One whole command, its reply included, within this long. The socket timeout bounds each read, not
# the sum of them: a Redis (or a proxy) that trickles a byte every 0.3 s would otherwise hold the
# caller, under the key's lock, and every local waiter with it. 64 MiB at 100 MB/s takes 0.7 s.
DEFAULT_OPERATION_TIMEOUT_S = 5.0
DEFAULT_MAX_ENTRY_BYTES = 64 << 20


DOWN = object()  # what a Redis command "returns" while Redis is unavailable


def pack(files: dict[str, bytes], secret: bytes | None, bound_to: str) -> bytes:
    names = sorted(files)
    header = json.dumps({"files": [[name, len(files[name])] for name in names]}).encode()
    body = b"".join([MAGIC, _LEN.pack(len(header)), header, *(files[name] for name in names)])
    return body + (bound_mac(secret, bound_to, body) if secret else b"")


def unpack(value: bytes, required: frozenset[str], secret: bytes | None, bound_to: str,
           exact: bool = True) -> dict[str, bytes]:
    """The verified files of a remote value stored under `bound_to`. Raises RemoteCorrupt, whatever is
    wrong with it: a value is input from whoever can write to Redis."""
    try:
        return _unpack(value, required, secret, bound_to, exact)
    except RemoteCorrupt:
        raise
    except Exception as err:  # any parse failure of untrusted bytes is a refused value, never a crash
        raise RemoteCorrupt(f"unreadable: {type(err).__name__}: {err}") from None


def _unpack(value: bytes, required: frozenset[str], secret: bytes | None, bound_to: str,
            exact: bool) -> dict[str, bytes]:
    if secret:
        body, signature = value[:-DIGEST_SIZE], value[-DIGEST_SIZE:]
        if len(value) <= DIGEST_SIZE or not hmac.compare_digest(signature, bound_mac(secret, bound_to, body)):
            raise RemoteCorrupt("its signature does not verify with KCACHE_REMOTE_SECRET for this key (unsigned, "
                                "another secret, or a value copied from another key)")
    else:
        body = value
    if body[:4] != MAGIC or len(body) < 8:
        raise RemoteCorrupt("not a kcache entry")
    (header_size,) = _LEN.unpack(body[4:8])
    listing = json.loads(body[8:8 + header_size])["files"]
    files: dict[str, bytes] = {}
    offset = 8 + header_size
    for item in listing:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
                and item[1] >= 0 and item[0] not in files):
            raise RemoteCorrupt(f"bad file entry {item!r}")
        name, size = item
        files[name] = body[offset:offset + size]
        offset += size
    if offset != len(body):
        raise RemoteCorrupt("the files' sizes do not add up to the value's length")
    try:
        verify_contents("remote value", files, required, exact)  # exactly the kind's components, each as listed
    except CorruptEntry as err:
        raise RemoteCorrupt(err.reason) from None
    return files


class RedisTier:
    """Entries of one namespace (entry format and toolchain) in one Redis."""

    name = "redis"

    def __init__(self, url: str, namespace: str, required: frozenset[str], *, secret: str | None = None,
                 ttl_s: float | None = None, max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retry_after_s: float = DEFAULT_RETRY_AFTER_S,
                 operation_timeout_s: float = DEFAULT_OPERATION_TIMEOUT_S, client: Any = None,
                 exact: bool = True, bound_meta: str = "meta.json") -> None:
        import redis

        self.url = masked(url)  # what messages name: never the password (the client gets `url`)
        self.prefix = f"kcache:{namespace}:"
        self.required = frozenset(required)
        self.exact = exact  # the value holds exactly `required` (False: at least; the kind checks the rest)
        self.bound_meta = bound_meta  # the file that names the entry's key
        self.secret = secret.encode() if secret else None
        self.ttl_ms = int(ttl_s * 1000) if ttl_s else None
        self.max_entry_bytes = max_entry_bytes
        self._breaker = CircuitBreaker(self.url, operation_timeout_s, retry_after_s)
        self._client = client or redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        # The size (and type) is checked inside Redis before a byte is sent: a planted multi-GB value or a
        # hash under an entry's name costs the reader one small reply, not its memory.
        self._get_capped = register_capped_get(self._client)
        self._leases = RedisLeases(self._client, self.prefix, self.url, self.secret, self._call, self._get_capped)

    # ------------------------------------------------------------ entries

    def get(self, key: str) -> dict[str, bytes] | None:
        """The verified files of `key`, or None (absent, corrupt, refused, or Redis unavailable)."""
        cap = self.max_entry_bytes + DIGEST_SIZE
        value = capped_value(self._call(lambda: self._get_capped(keys=[self.prefix + key], args=[cap])),
                             f"the {self.max_entry_bytes} of KCACHE_REMOTE_MAX_ENTRY")
        if value is None:
            return None
        try:
            if isinstance(value, RemoteCorrupt):
                raise value
            files = unpack(value, self.required, self.secret, self.prefix + key, self.exact)
            check_bound_key("remote value", files, key, self.bound_meta)
        except (RemoteCorrupt, CorruptEntry) as corrupt:
            warn_refused(self.url, self.prefix + key, getattr(corrupt, "reason", corrupt))
            return None
        return files

    def put(self, key: str, files: dict[str, bytes], *, replace: bool = False) -> bool:
        """The entry as one SET, which replaces whatever is there (so `replace`, for a forced re-tune,
        changes nothing here); whether Redis took it."""
        value = pack(files, self.secret, self.prefix + key)
        if len(value) > self.max_entry_bytes:
            log.debug("kcache: %s is %d bytes, over KCACHE_REMOTE_MAX_ENTRY: not uploaded", key, len(value))
            return False
        return bool(self._call(lambda: self._client.set(self.prefix + key, value, px=self.ttl_ms)))

    # ------------------------------------------------------------ leases (kcache.tiers.redis_lease)

    def try_lease(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> RedisLease | bool | None:
        """A lease on compiling `key` (renewed until released); False if another node holds a valid one;
        None if Redis is unavailable. One attempt: RemoteTiers.claim waits."""
        return self._leases.try_lease(key, lease_s)

    def lease_held(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> bool | None:
        """Whether a node holds a valid compile lease of `key`; None if Redis is unavailable."""
        return self._leases.lease_held(key, lease_s)

    # ------------------------------------------------------------ availability

    def available(self) -> bool:
        return self._breaker.available()

    def _call(self, operation: Callable[[], Any], failed: Any = None) -> Any:
        """One Redis command within the breaker's deadline (remote_guard.CircuitBreaker): whatever the
        client raised (a wrong endpoint makes redis-py raise AttributeError, say) or an overrun marks
        Redis down for a while and returns `failed`. A lease taken by a command that overran is never
        renewed and lapses."""
        return self._breaker.call(operation, failed)
