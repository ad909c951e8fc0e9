"""`HELION_REMOTE_CACHE_BACKEND=kcache.helion.Backend`: Helion's autotune picks on kcache's store.

Helion's `RemoteAutotuneCache` (HELION_AUTOTUNE_CACHE) builds the backend with no arguments and calls
`get(key)` before an autotune, `put(key, data)` after it, and `list(n)` for a warm start. Here:
- `get` reads the verified entry of the key from this process's roots (kcache.helion.store), then
  from the remote tiers (KCACHE_REMOTE); a miss takes the key's tune claim (kcache.results.tune_once):
  processes and nodes that miss one key at once get one tune between them, the others wait for its
  pick (bounded by KCACHE_TUNE_WAIT, backing off) and take over if the tuner dies;
- `put` checks the value (bounded JSON, a record whose `config` is a config's JSON), publishes it whole,
  uploads it to the tiers, and releases the claim; a backend that Helion drops (a tune that failed)
  releases it too.
Helion's own local cache still writes its file; kcache's entry is the one shared.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from helion.autotuner.remote_cache import RemoteCacheBackend

from kcache.helion import store

log = logging.getLogger("kcache")


class Backend(RemoteCacheBackend):
    """Helion's `RemoteCacheBackend` (Helion 1.5) on kcache's store."""

    def __init__(self) -> None:
        from kcache.config import Settings
        from kcache.triton.roots import roots  # the roots of this process's settings, decided once per root

        self._settings = Settings.from_env()
        where = roots(self._settings)
        self._write: Path | None = where.write
        self._reads: tuple[Path, ...] = where.reads
        self._claims: dict[str, Any] = {}  # Helion key -> the TuneOnce this process holds while it tunes
        self._lock = threading.Lock()
        weakref.finalize(self, _release_all, self._claims)

    def get(self, key: str) -> str | None:
        found = self._read(key)
        if found is not None or self._write is None:
            _counted(self._write, "hit" if found is not None else "miss", key, found,
                     " (disk)" if found is not None else ": Helion tunes it")
            return found
        from kcache.results.tune_once import RemoteResults, TuneOnce  # a miss's

        tiers = self._tiers()
        once = TuneOnce(self._write / store.NAMESPACE, store.entry_key(key), f"Helion kernel {key[:16]}",
                        load=lambda: self._read(key, remote=False), exists=lambda: self._entry_exists(key),
                        wait_s=self._settings.tune_wait_s, lease_s=self._settings.remote_lease_s,
                        remote=RemoteResults(tiers, store.store_of(self._write), store.entry_key(key)) if tiers else None)
        started = time.monotonic()
        found = once.claim()
        if found is None and once.held:
            with self._lock:
                self._claims[key] = once
        if found is not None:  # another process's (or node's) tune, waited for
            _counted(None, "wait", key, found, f": {time.monotonic() - started:.1f} s for another process's tune")
        _counted(self._write, "hit" if found is not None else "miss", key, found,
                 " (another process's tune)" if found is not None else ": Helion tunes it")
        return found

    def put(self, key: str, data: str) -> None:
        try:
            try:
                value = store.checked_value(data, f"Helion's pick for {key[:16]}")
            except ValueError as refused:  # Helion's local cache keeps it: not shared, one line
                log.warning("kcache: not saving %s", refused)
                return
            _counted(self._write, "compile", key, value, ": its pick saved")
            if self._write is not None and store.publish_value(self._write, key, value):
                with self._lock:
                    once = self._claims.get(key)
                if once is not None:
                    once.upload()
                else:
                    tiers = self._tiers()
                    if tiers is not None:
                        tiers.upload_from(store.store_of(self._write), store.entry_key(key))
        finally:
            with self._lock:
                once = self._claims.pop(key, None)
            if once is not None:
                once.release()

    def list(self, max_results: int | None = None) -> Iterable[str]:
        values: list[str] = []
        for root in self._reads:
            values += store.newest_values(root, None if max_results is None else max_results - len(values))
        return values

    # ------------------------------------------------------------------

    def _read(self, key: str, *, remote: bool = True) -> str | None:
        for root in self._reads:
            found = store.read_value(root, key)
            if found is not None:
                return found
        tiers = self._tiers() if remote and self._write is not None else None
        if tiers is not None and tiers.fetch_into(store.store_of(self._write), store.entry_key(key)) is not None:
            return store.read_value(self._write, key)  # type: ignore[arg-type]
        return None

    def _entry_exists(self, key: str) -> bool:
        return self._write is not None and (self._write / store.NAMESPACE / store.entry_key(key)).is_dir()

    def _tiers(self) -> Any:
        """The remote tiers of KCACHE_REMOTE for Helion's entries (opened once per backend), or None."""
        if not hasattr(self, "_remote"):
            from kcache.setting_values import remote_urls

            urls = remote_urls(self._settings.remote_url)
            self._remote = None
            if urls:
                from kcache.tiers.remote_chain import open_remote_tiers

                self._remote = open_remote_tiers(urls, f"{store.NAMESPACE}:v1", frozenset({store.META}),
                                                 self._settings, exact=False, bound_meta=store.META)
        return self._remote


def _counted(root: Path | None, event: str, key: str, value: str | None, detail: str) -> None:
    """Count `event` (hit, miss, compile: a tune's pick put) into `root`'s stats as Helion's, and log it
    (KCACHE_LOG); a wait is logged only. The kernel's name is read from the value, where it is logged."""
    from kcache import lookup_log
    from kcache.maintenance.counter_file import count_lookup

    if event != "wait":
        count_lookup(root, "helion", **{_COUNTER[event]: 1})
    if lookup_log.enabled(event):
        try:
            kernel = store.kernel_of(json.loads(value)) if value is not None else "?"
        except ValueError:
            kernel = "?"
        lookup_log.lookup("helion", event, f"{kernel} (Helion)", store.entry_key(key), detail)


_COUNTER = {"hit": "hits", "miss": "misses", "compile": "compiles"}


def _release_all(claims: dict[str, Any]) -> None:
    """Helion dropped the backend: the tunes it did not finish (an error) free their claims."""
    for once in list(claims.values()):
        once.release()
    claims.clear()
