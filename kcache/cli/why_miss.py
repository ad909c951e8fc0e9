"""`kcache why-miss KEY|--last [--keys FILE]`: which fields of a missed key differ from the nearest
stored entries of the same kernel (kcache.cache.miss_explain).

The missed key's fields come from this user's miss log under the root (every compile, and every
compile the JIT guard refused, is logged), else from a KCACHE_RECORD file (`--keys`, e.g. the
deployment's record from another machine), else from the key's own entry if it is stored now.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

from kcache.cache import miss_explain
from kcache.cli.contract import NotFound
from kcache.cli.format import human_age, short_key
from kcache.config import Settings
from kcache.store.components import KERNELS
from kcache.store.layout import TRITON
from kcache.triton.key_fields import stored_fields
from kcache.triton.store import KERNEL_SUFFIX

MIN_PREFIX = 4


def add_parser(command: Any) -> None:
    why = command("why-miss", "why a key missed: the fields in which it differs from the nearest stored "
                  "entries of its kernel (target, arch, pass_configs, out_idx, toolchain, source; a Triton "
                  "kernel's: target, Triton's version, options, source)")
    which = why.add_mutually_exclusive_group(required=True)
    which.add_argument("key", nargs="?", help="the missed key or a unique prefix of one (a guard's message names it)")
    which.add_argument("--last", action="store_true", help="the newest miss logged under the root")
    why.add_argument("--keys", metavar="FILE", help="also look the key up in this KCACHE_RECORD file")


def cmd_why_miss(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    root = settings.root
    record = _find(args, root)
    kernel = str(record.get("kernel", "?"))
    if isinstance(record.get("crashed"), str):  # a Triton compile that crashed: no group, no fields to compare
        return _crashed(record, kernel)
    triton = kernel.endswith(KERNEL_SUFFIX)  # a Triton kernel's (kcache.triton): compared with Triton's groups
    explanation = miss_explain.explain(root, record["key"], kernel, record["fields"],
                                       stored_fields(root) if triton else None)
    stored = (root / (TRITON if triton else KERNELS) / record["key"]).is_dir()
    when = record.get("time")
    seen = (f"missed {human_age(time.time() - when)} ago on {record.get('host', '?')}, pid {record.get('pid', '?')}"
            f"{', refused by the JIT guard' if record.get('refused') else ''}"
            if isinstance(when, (int, float)) else f"from {record.get('source', '?')}")
    lines = [f"kernel {explanation.kernel}, key {short_key(record['key'])} ({seen})",
             f"stored in {root} now: {'yes (it compiled or was imported since)' if stored else 'no'}"]
    lines.append(explanation.headline() + (":" if explanation.differences else ""))
    lines += [f"  {difference.render()}" for difference in explanation.differences]
    result = {**explanation.as_dict(), "stored": stored, "missed_at": when, "refused": bool(record.get("refused"))}
    return result, "\n".join(lines), 0


def _crashed(record: dict[str, Any], kernel: str) -> tuple[Any, str, int]:
    """A lookup that a crash ended (kcache.triton.crashes): what crashed, and what to do; its key fields
    are unknown, since Triton compiled no group to read them from."""
    when = record.get("time")
    ago = f"{human_age(time.time() - when)} ago" if isinstance(when, (int, float)) else "at an unknown time"
    lines = [f"kernel {kernel}, key {short_key(record['key'])} (missed {ago} on {record.get('host', '?')}, "
             f"pid {record.get('pid', '?')})",
             f"its compile crashed ({record['crashed']}): Triton compiled no group, so there are no key fields "
             "to compare; `kcache ls` lists the crash (kind triton crash) and `kcache clear` forgets it"]
    result = {"key": record["key"], "kernel": kernel, "crashed": record["crashed"], "missed_at": when,
              "differences": [], "stored": False, "refused": False}
    return result, "\n".join(lines), 0


def _find(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The missed key's record {"key", "kernel", "fields", ...}: the newest logged miss that matches,
    else a record of --keys, else the key's stored entry. Raises NotFound (one line) when none or
    several match, ValueError for what is no key prefix."""
    logged = miss_explain.logged_misses(root)
    if args.last:
        if not logged:
            raise NotFound(f"why-miss: no miss is logged under {root} for this user: a miss is logged by the process "
                           "that compiles (or whose JIT guard refuses) under this root", root)
        return logged[-1]
    prefix = args.key.strip().lower()
    if len(prefix) < MIN_PREFIX or any(c not in "0123456789abcdef" for c in prefix):
        raise ValueError(f"why-miss: {args.key!r} is no key or key prefix (at least {MIN_PREFIX} hex digits)")
    candidates = [r for r in reversed(logged) if r["key"].startswith(prefix)]
    if not candidates and args.keys:
        from kcache.bundle.importer import read_key_records

        candidates = [{**r, "source": args.keys} for r in read_key_records(args.keys)
                      if r["key"].startswith(prefix) and isinstance(r.get("fields"), dict)]
    if not candidates:
        stored = itertools.chain(miss_explain.stored_metas(root), stored_fields(root))
        candidates = [{"key": key, "kernel": meta.get("kernel"), "fields": fields, "source": "its stored entry"}
                      for key, meta in stored if key.startswith(prefix)
                      for fields, partial in [miss_explain.comparable_fields(meta)] if not partial]
    keys = {r["key"] for r in candidates}
    if len(keys) > 1:
        raise NotFound(f"why-miss: {prefix!r} matches {len(keys)} keys ({', '.join(sorted(short_key(k) for k in keys)[:4])}"
                       "...): give more digits", root)
    if not candidates:
        where = f", in {args.keys}" if args.keys else ""
        raise NotFound(f"why-miss: no key {prefix} is logged as a miss under {root}{where}, or stored there with "
                       "its key fields: pass the file the deployment recorded (--keys, from KCACHE_RECORD), or "
                       "run the program once more under this root", root)
    return candidates[0]
