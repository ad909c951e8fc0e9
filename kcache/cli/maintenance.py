"""`kcache verify`, `prune`, `untune`, `gc` and `doctor`: the commands that check a cache root and
remove (or, with --repair and --fix, mend) what it should not keep."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from kcache.cli.contract import NotFound
from kcache.cli.doctor import doctor, installed_tilelang
from kcache.cli.entries import AUTOTUNER, autotune_results, entry_meta, kernel_store
from kcache.cli.format import count_of, format_table, human_age, human_size, short_key
from kcache.config import Settings
from kcache.errors import CorruptEntry
from kcache.maintenance.eviction import evict, evict_entry, scan_entries
from kcache.maintenance.gc import collect_garbage, staging_dirs
from kcache.store import layout
from kcache.store.components import META
from kcache.store.elf import require_loadable
from kcache.store.locks import KeyLock

# `kcache gc` removes the entries of other TileLang versions unused, and the quarantine kept, this long.
OTHER_VERSION_UNUSED_S = 7 * 86400


def cmd_verify(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    from kcache.triton.store import store_of as triton_store_of

    bad = []
    keys = []
    # TileLang's kernels, then Triton's groups (kcache.triton), each under its own locks.
    for store in (kernel_store(settings), triton_store_of(settings.root)):
        for key in store.keys():
            keys.append(key)
            try:
                files = store.read(key)
                if files is not None and _is_tilelang_entry(files):
                    require_loadable(str(store.entry_path(key)), files)  # the hash can match a library cut short
            except CorruptEntry as corrupt:
                entry = {"key": key, "reason": corrupt.reason, "quarantined": None}
                if args.repair:
                    lock = KeyLock(store.root / layout.LOCKS / f"{key}.lock", key)
                    if lock.acquire(settings.lock_timeout_s) is not None:
                        with lock:
                            moved = store.quarantine(key, f"kcache verify: {corrupt.reason}")
                        entry["quarantined"] = str(moved) if moved else None
                bad.append(entry)
    in_progress = sum(len(os.listdir(d)) for d in staging_dirs(settings.root))
    result = {"entries": len(keys), "bad": bad, "staging_in_progress": in_progress}
    lines = [f"{count_of(len(keys), 'entry', 'entries')}, {len(keys) - len(bad)} good, {len(bad)} bad; "
             f"{count_of(in_progress, 'staging directory', 'staging directories')} (unpublished writes: never visible)"]
    lines += [f"  BAD {short_key(b['key'])}: {b['reason']}" + (f" -> {b['quarantined']}" if b["quarantined"] else "")
              for b in bad]
    if bad and not args.repair:
        lines.append("run `kcache verify --repair` to quarantine them; they recompile on next use")
    unrepaired = [b for b in bad if not b["quarantined"]]
    return result, "\n".join(lines), 1 if unrepaired else 0


def cmd_prune(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    # An option left out takes the setting; one given as 0 parses to None, no limit, and must not.
    max_size = getattr(args, "max_size", settings.max_size_bytes)
    max_age = getattr(args, "max_age", settings.max_age_s)
    report = evict(settings.root, max_size, max_age)
    result = {"evicted": report.evicted, "freed_bytes": report.freed_bytes, "remaining": report.remaining,
              "remaining_bytes": report.remaining_bytes, "max_size_bytes": max_size, "max_age_s": max_age}  # None: no limit
    limits = (f"size {human_size(max_size) if max_size is not None else 'no limit'}, "
              f"age {human_age(max_age) if max_age is not None else 'no limit'}")
    return result, (f"evicted {count_of(report.evicted, 'entry', 'entries')} ({human_size(report.freed_bytes)}); "
                    f"{report.remaining} remain ({human_size(report.remaining_bytes)}); limits: {limits}"), 0


def cmd_untune(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    matches = [p for p in autotune_results(settings.root) if p.name.startswith(args.key)]
    if len(matches) != 1:
        why = "no autotune result matches" if not matches else f"{len(matches)} autotune results match"
        raise NotFound(f"untune: {why} {args.key!r} under {settings.root / AUTOTUNER} (see `kcache tunes`)",
                       settings.root / AUTOTUNER)
    removed = evict_entry(settings.root, matches[0])
    return ({"removed": str(matches[0]) if removed else None},
            f"removed {matches[0]}: the next tune of it runs again" if removed else
            f"kcache: {matches[0]} was already gone", 0)


def cmd_gc(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    report = collect_garbage(settings.root, settings.staging_ttl_s, settings.max_size_bytes, settings.max_age_s,
                             quarantine_age_s=OTHER_VERSION_UNUSED_S)
    version = installed_tilelang()
    old_versions = 0
    if version is not None:
        now = time.time()
        for entry in scan_entries(settings.root):
            built_by = entry_meta(entry.path).get("tilelang")
            if built_by and built_by != version and now - entry.last_used > OTHER_VERSION_UNUSED_S:
                old_versions += evict_entry(settings.root, entry.path)
    result = {**vars(report), "other_versions_removed": old_versions}
    text = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in result.items())
    return result, text, 0


def cmd_doctor(args: argparse.Namespace, settings: Settings | None) -> tuple[Any, str, int]:
    # Settings are the doctor's to read: a bad one is a finding, not a stop (main passes None).
    findings = doctor(settings if settings is not None else args.dir, fix=args.fix)
    problems = [f for f in findings if f.problem and not f.fixed]
    rows = [("FIXED" if f.fixed else "PROBLEM" if f.problem else "ok", f.check,
             f.detail + (f"; fix: {f.fix}" if f.problem and not f.fixed and f.fix else ""))
            for f in findings]
    reported = [{k: v for k, v in vars(f).items() if k != "fix" or f.problem} for f in findings]
    return reported, format_table(["", "check", "detail"], rows), 1 if problems else 0


def _is_tilelang_entry(files: dict[str, bytes]) -> bool:
    """Whether a verified entry is TileLang's (its library is dlopened: worth an ELF check); stress's
    synthetic entries hold random bytes there."""
    try:
        meta = json.loads(files[META])
    except (KeyError, ValueError):
        return False
    return isinstance(meta, dict) and "tilelang" in meta
