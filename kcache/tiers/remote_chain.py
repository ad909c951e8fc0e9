"""The remote tiers of KCACHE_REMOTE as one, nearest first (Redis, then S3), as sccache layers its
caches: a hit in a farther tier is backfilled into every nearer one (and, by the caller, into the
local disk); an upload goes to all of them; a compile lease is taken in the nearest tier that
answers (Redis's where one is configured, else the S3 lease object).

`claim` is the one wait on another node's lease (a compile's, a tune's): the tiers make one attempt
per call, and `claim` owns the deadline, the pauses between attempts (kcache.tiers.backoff) and the
message that says whom a node waits for.

Each tier keeps its own circuit breaker: a Redis that is down leaves S3 in use, and the reverse.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kcache.errors import KCacheError
from kcache.store.entries import EntryStore
from kcache.tiers.backoff import Backoff

log = logging.getLogger("kcache")

Found = TypeVar("Found")


class RemoteLease(Protocol):
    def release(self) -> None: ...


class RemoteTier(Protocol):
    """What a remote tier offers: kcache.tiers.redis_tier.RedisTier, kcache.tiers.s3_tier.S3Tier."""

    name: str
    url: str

    def available(self) -> bool: ...
    def get(self, key: str) -> dict[str, bytes] | None: ...
    def put(self, key: str, files: dict[str, bytes], *, replace: bool = False) -> bool: ...
    def try_lease(self, key: str, lease_s: float) -> RemoteLease | bool | None: ...
    def lease_held(self, key: str, lease_s: float) -> bool | None: ...


@dataclass
class Claim(Generic[Found]):
    """How `RemoteTiers.claim` ended: another node's result was found, or the lease is this node's, or
    another node held it for the whole wait (`timed_out`); none of them: no tier answers."""

    found: Found | None = None
    lease: RemoteLease | None = None
    timed_out: bool = False


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

    def upload_from(self, store: EntryStore, key: str, *, replace: bool = False) -> bool:
        """The local entry `key` of `store`, verified, into every tier; whether any took it. `replace`
        (a forced re-tune): it replaces a verifying entry of `key` in every tier, not only a corrupt one."""
        try:
            files = store.read_with_manifest(key)
        except (KCacheError, OSError) as err:
            log.debug("kcache: not uploading %s: %s", key[:16], err)
            return False
        if files is None:
            return False
        return [tier.put(key, files, replace=replace) for tier in self.tiers].count(True) > 0

    def claim(self, key: str, lease_s: float, timeout_s: float, look: Callable[[], Found | None], *,
              on_wait: Callable[[], None] | None = None) -> Claim[Found]:
        """Wait, at most `timeout_s`, until `look()` returns another node's result, or the lease of `key`
        is this node's. Each attempt is one look and one try of the lease; while another node holds a
        valid lease the attempts back off (a jittered window widening to a second), and past the
        timeout the claim ends `timed_out` (the caller decides: compile anyway, or raise). `on_wait()`
        says once that the wait began (default: a line at INFO)."""
        backoff = Backoff(timeout_s)
        while True:
            found = look()
            if found is not None:
                return Claim(found=found)
            lease = self.try_lease(key, lease_s)
            if lease is None:
                return Claim()  # no tier answers: work here, without a lease
            if lease is not False:
                return self._ours(lease, look)
            if backoff.attempts == 0:
                if on_wait is not None:
                    on_wait()
                else:
                    log.info("kcache: another node holds the lease of %s in %s; waiting up to %.0f s for it",
                             key[:16], self.url, timeout_s)
            if not backoff.pause():
                return Claim(timed_out=True)

    @staticmethod
    def _ours(lease: RemoteLease, look: Callable[[], Found | None]) -> Claim[Found]:
        """A lease just taken. The holder before us may have uploaded and released between our last look
        and our lease: look once more, or the work is done twice."""
        try:
            found = look()
        except BaseException:
            lease.release()
            raise
        if found is not None:
            lease.release()
            return Claim(found=found)
        return Claim(lease=lease)

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


def open_remote_tiers(urls: list[str], namespace: str, required: frozenset[str], settings: Any, *,
                      exact: bool = True, bound_meta: str = "meta.json") -> RemoteTiers:
    """The tiers of `urls` (config.remote_urls) for one namespace, with the settings' secret and limits.
    `exact`: an entry holds exactly the files `required` (False: at least them, for a kind whose files
    vary, which checks the rest itself: Triton's groups). `bound_meta`: the file whose "key" names the
    entry's key (an entry copied under another key is refused)."""
    tiers: list[RemoteTier] = []
    for url in urls:
        if url.lower().startswith("s3://"):
            from kcache.tiers.s3_tier import S3Tier

            tiers.append(S3Tier(url, namespace, required, secret=settings.remote_secret,
                                max_entry_bytes=settings.remote_max_entry_bytes, exact=exact,
                                bound_meta=bound_meta))
        else:
            from kcache.tiers.redis_tier import RedisTier

            tiers.append(RedisTier(url, namespace, required, secret=settings.remote_secret,
                                   ttl_s=settings.remote_ttl_s, max_entry_bytes=settings.remote_max_entry_bytes,
                                   exact=exact, bound_meta=bound_meta))
    return RemoteTiers(tiers)
