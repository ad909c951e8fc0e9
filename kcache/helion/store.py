"""Helion's autotune picks as kcache entries: `<root>/helion/<key>/`, published whole with one rename.

Helion hands its remote cache backend a key (`stable_hash()` of the kernel, its arguments' shapes and
types, the device and Helion's version) and a value: the best config's JSON record, never an artifact.
Here the value is one entry of kcache's store (`EntryStore`: staged, manifest of sizes and sha256,
fsynced, one rename), named by the sha256 of Helion's key, beside a `kcache-helion.json` that names both
keys. A reader verifies the entry whole, trust checked on every descriptor from the cache root down,
and checks the value before Helion sees it: bounded JSON, an object whose `config` is a config's JSON
object (as Helion's `Config.to_json` writes it), never executed. The remote tiers (KCACHE_REMOTE) carry the entries with their signing and key binding, in a
namespace of their own (`helion:v1`).

This module knows nothing of Helion's classes (kcache.helion.backend adapts them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache.errors import CorruptEntry, UntrustedEntry
from kcache.store import layout
from kcache.store.manifest import read_verified

if TYPE_CHECKING:
    from kcache.store.entries import EntryStore

log = logging.getLogger("kcache")

NAMESPACE = layout.HELION
META = "kcache-helion.json"
VALUE = "best_config.json"
MAX_VALUE_BYTES = 1 << 20  # a config's record is a few KiB
FILES = frozenset({META, VALUE})  # an entry's files, its manifest aside


def entry_key(helion_key: str) -> str:
    return hashlib.sha256(helion_key.encode()).hexdigest()


def store_of(root: Path) -> EntryStore:
    from kcache.store.entries import EntryStore

    return EntryStore(root / NAMESPACE, "", FILES, bind_key=False, trust_root=root)


def checked_value(data: str | bytes, where: str) -> str:
    """`data` as a value Helion may read: at most MAX_VALUE_BYTES of JSON, an object whose `config` is an
    object. Raises ValueError naming `where` otherwise."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_VALUE_BYTES:
        raise ValueError(f"{where}: {len(raw)} bytes, more than {MAX_VALUE_BYTES} (a config's record is KiBs)")
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{where}: not JSON ({type(err).__name__})") from None
    # Helion's record: {"config": Config.to_json(), "key": ..., ...}; its reader does Config.from_json(record["config"])
    config = record.get("config") if isinstance(record, dict) else None
    try:
        parsed = json.loads(config) if isinstance(config, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(f"{where}: not a Helion config record (an object whose 'config' is a config's JSON object)")
    return raw.decode()


def kernel_of(record: Any) -> str:
    """The kernel a Helion record names (its key's fields: kernel_name, name or kernel), else "?"."""
    key = record.get("key") if isinstance(record, dict) else None
    fields = key.get("fields") if isinstance(key, dict) else None
    if not isinstance(fields, dict):
        return "?"
    return next((str(fields[name]) for name in ("kernel_name", "name", "kernel") if name in fields), "?")


def read_value(root: Path, helion_key: str) -> str | None:
    """The verified, checked value of `helion_key` under `root`, or None (a miss, or a refused entry:
    one warning; an untrusted entry is never moved, a corrupt one is moved aside)."""
    return _checked_entry(root, entry_key(helion_key), helion_key)


def _checked_entry(root: Path, key: str, helion_key: str | None) -> str | None:
    """The value of the entry `key` under `root`, verified whole (trust checked from the root down)
    before anything of it is read, then its record checked (`bound_value`; it must name `helion_key`
    where one is given); None for a miss or a refused entry, with one warning."""
    directory = root / NAMESPACE / key
    try:
        files = read_verified(directory, FILES, trust_root=root, exact=True)
    except UntrustedEntry as untrusted:
        log.warning("kcache: ignoring the Helion entry %s: %s", directory, untrusted.reason)
        return None
    except CorruptEntry as corrupt:
        _quarantine(root, key, corrupt.reason)
        return None
    if files is None:
        return None
    try:
        named, value = bound_value(files, key, str(directory))
        if helion_key is not None and named != helion_key:
            raise ValueError(f"{META} names another Helion key: an entry copied from another key")
        return value
    except ValueError as err:
        _quarantine(root, key, str(err))
        return None


def bound_value(files: dict[str, bytes], key: str, where: str) -> tuple[str, str]:
    """The Helion key and the checked value of the entry `key` whose verified files are `files`: its
    record must name `key` and a Helion key whose entry key is `key` (an entry moved under another key
    is refused), and its value must pass `checked_value`. ValueError naming `where` otherwise."""
    try:
        meta = json.loads(files[META])
    except (ValueError, RecursionError):
        meta = None
    helion_key = meta.get("helion_key") if isinstance(meta, dict) else None
    if not isinstance(helion_key, str) or meta.get("key") != key or entry_key(helion_key) != key:  # type: ignore[union-attr]
        raise ValueError(f"{where}: {META} names another key: an entry copied from another key")
    return helion_key, checked_value(files[VALUE], f"{where}/{VALUE}")


def publish_value(root: Path, helion_key: str, value: str) -> bool:
    """Publish `value` (checked) as the entry of `helion_key`: whole, or not at all; whether it is there."""
    key = entry_key(helion_key)
    meta = {"key": key, "helion_key": helion_key, "created": time.time()}
    files = {VALUE: value.encode(), META: json.dumps(meta, sort_keys=True).encode()}
    try:
        store_of(root).publish_files(key, files)
    except OSError as err:
        log.warning("kcache: cannot save Helion's pick %s in %s (%s)", key[:16], root, getattr(err, "strerror", err))
        return False
    return True


def newest_values(root: Path, limit: int | None) -> list[str]:
    """The checked values of the entries under `root`, newest first (Helion's warm start). Each entry is
    read as `read_value` reads one, trust and manifest first, then its record: one that is not a record
    of its own key (`{"helion_key": 5}`, planted) is skipped with one warning, and the others are listed."""
    dated: list[tuple[float, str]] = []
    try:
        for entry in os.scandir(root / NAMESPACE):
            if layout.is_key(entry.name):
                try:
                    dated.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
                except FileNotFoundError:  # evicted meanwhile
                    continue
    except FileNotFoundError:
        return []
    values: list[str] = []
    for _, name in sorted(dated, reverse=True):
        if limit is not None and len(values) >= limit:
            break
        value = _checked_entry(root, name, None)
        if value is not None:
            values.append(value)
    return values


def _quarantine(root: Path, key: str, reason: str) -> None:
    """Move a corrupt entry aside under its key's lock (so that a pick published meanwhile is never the
    one moved), else one warning: the caller tunes either way."""
    from kcache.config import Settings
    from kcache.errors import CacheLockTimeout
    from kcache.store.locks import KeyLock

    lock = KeyLock(root / NAMESPACE / layout.LOCKS / f"{key}.lock", key)
    try:
        lock.acquire(Settings.from_env().lock_timeout_s)
        with lock:
            store_of(root).quarantine(key, reason)
    except (OSError, CacheLockTimeout) as err:  # PublishError, a failed move, is an OSError
        log.warning("kcache: ignoring the Helion entry %s: %s; it cannot be moved aside (%s)",
                    root / NAMESPACE / key, reason, getattr(err, "strerror", None) or err)
