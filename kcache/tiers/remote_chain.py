"""The remote tiers of KCACHE_REMOTE as one, nearest first (Redis, then S3), as sccache layers its
caches: a hit in a farther tier is backfilled into every nearer one (and, by the caller, into the
local disk); an upload goes to all of them; a compile lease is taken in the nearest tier that
answers (Redis's where one is configured, else the S3 lease object).

Each tier keeps its own circuit breaker: a Redis that is down leaves S3 in use, and the reverse.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kcache.errors import KCacheError
from kcache.store.entries import EntryStore

log = logging.getLogger("kcache")


class RemoteLease(Protocol):
    def release(self) -> None: ...


class RemoteTier(Protocol):
    """What a remote tier offers: kcache.tiers.redis_tier.RedisTier, kcache.tiers.s3_tier.S3Tier."""

    name: str
    url: str

    def available(self) -> bool: ...
    def get(self, key: str) -> dict[str, bytes] | None: ...
    def put(self, key: str, files: dict[str, bytes]) -> bool: ...
    def try_lease(self, key: str, lease_s: float) -> RemoteLease | bool | None: ...
    def lease_held(self, key: str, lease_s: float) -> bool | None: ...


class RemoteTiers:
    """One namespace's entries in every configured remote tier."""

    def __init__(self, tiers: list[RemoteTier]) -> None:
        if not tiers:
            raise ValueError("no remote tier")
        self.tiers = tiers
        self.url = ",".join(tier.url for tier in tiers)

    def available(self) -> bool:
        return any(tier.available() for tier in self.tiers)

    def fetch_into(self, store: EntryStore, key: str) -> str | None:
        """The first tier's verified entry `key` published into `store`; the name of that tier ("redis",
        "s3") or None. Nearer tiers that missed it get a copy."""
        for index, tier in enumerate(self.tiers):
            files = tier.get(key)
            if files is None:
                continue
            try:
                store.publish_files(key, files)
            except (KCacheError, OSError) as err:
                log.warning("kcache: could not store the remote entry %s locally: %s", key[:16], err)
                return None
            for nearer in self.tiers[:index]:
                nearer.put(key, files)  # backfill; a tier that is down skips it and says so once
            return tier.name
        return None

    def upload_from(self, store: EntryStore, key: str) -> bool:
        """The local entry `key` of `store`, verified, into every tier; whether any took it."""
        try:
            files = store.read_with_manifest(key)
        except (KCacheError, OSError) as err:
            log.debug("kcache: not uploading %s: %s", key[:16], err)
            return False
        if files is None:
            return False
        return [tier.put(key, files) for tier in self.tiers].count(True) > 0

    def try_lease(self, key: str, lease_s: float) -> Any:
        """A lease from the nearest tier that answers: the lease, False (another node holds it), or None
        (no tier answers)."""
        for tier in self.tiers:
            taken = tier.try_lease(key, lease_s)
            if taken is not None:
                return taken
        return None

    def lease_held(self, key: str, lease_s: float) -> bool | None:
        """Whether a node holds the lease of `key` in the nearest tier that answers (the one try_lease
        uses); None if none answers."""
        for tier in self.tiers:
            held = tier.lease_held(key, lease_s)
            if held is not None:
                return held
        return None


def open_remote_tiers(urls: list[str], namespace: str, required: frozenset[str], settings: Any) -> RemoteTiers:
    """The tiers of `urls` (config.remote_urls) for one namespace, with the settings' secret and limits."""
    tiers: list[RemoteTier] = []
    for url in urls:
        if url.lower().startswith("s3://"):
            from kcache.tiers.s3_tier import S3Tier

            tiers.append(S3Tier(url, namespace, required, secret=settings.remote_secret,
                                max_entry_bytes=settings.remote_max_entry_bytes))
        else:
            from kcache.tiers.redis_tier import RedisTier

            tiers.append(RedisTier(url, namespace, required, secret=settings.remote_secret,
                                   ttl_s=settings.remote_ttl_s, max_entry_bytes=settings.remote_max_entry_bytes))
    return RemoteTiers(tiers)
