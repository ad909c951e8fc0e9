"""`kcache` / `python -m kcache`: inspect, verify and prune a cache root; `kcache run` a TileLang program
with kcache installed. Only `run` imports TileLang."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.store import layout
from kcache.store.components import COMPONENTS, DEVICE_SOURCE, HOST_SOURCE, KERNELS, LIBRARY, META
from kcache.config import Settings, parse_age, parse_size
from kcache.tools.doctor import doctor, installed_tilelang
from kcache.errors import CorruptEntry
from kcache.maintenance.eviction import evict, evict_entry, recorded_size, scan_entries
from kcache.store.locks import KeyLock
from kcache.maintenance.gc import collect_garbage, staging_dirs
from kcache.store.manifest import MANIFEST_NAME
from kcache.maintenance.stats import read_persisted
from kcache.store.entries import EntryStore

AUTOTUNER = "autotuner"
OTHER_VERSION_UNUSED_S = 7 * 86400


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kcache", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="cache root (default: $KCACHE_DIR or the user cache directory)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("stats", help="the persisted stats of every process, and the size")
    commands.add_parser("ls", help="key, kernel, target, size, age, last used")
    show = commands.add_parser("show", help="one entry: meta, manifest, paths of the sources")
    show.add_argument("key", help="a key or a unique prefix of one")
    verify = commands.add_parser("verify", help="hash-check every entry")
    verify.add_argument("--repair", action="store_true", help="quarantine the bad ones (they recompile on next use)")
    prune = commands.add_parser("prune", help="evict least recently used entries down to a size or age")
    prune.add_argument("--max-size", type=parse_size, help="e.g. 5G (default: KCACHE_MAX_SIZE)")
    prune.add_argument("--max-age", type=parse_age, help="e.g. 30d (default: KCACHE_MAX_AGE)")
    clear = commands.add_parser("clear", help="remove the entries of the installed TileLang version")
    clear.add_argument("--all-versions", action="store_true", help="every entry and autotune result")
    commands.add_parser("gc", help="staging, trash, stale locks, old quarantine, unused entries of other TileLang versions")
    check = commands.add_parser("doctor", help="permissions, ownership, noexec, free space, toolchain, remote")
    check.add_argument("--fix", action="store_true", help="fix what can be fixed safely")
    program = commands.add_parser("run", help="run a Python program with kcache installed into TileLang "
                                  "(tilelang.compile, @tilelang.jit, the AutoTuner's results)")
    program.add_argument("-m", dest="module", help="run a module, as python -m does")
    program.add_argument("argv", nargs=argparse.REMAINDER, help="the script and its arguments")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_program(args)

    settings = Settings.from_env(args.dir)
    run: Callable[[argparse.Namespace, Settings], tuple[Any, str, int]] = COMMANDS[args.command]
    result, text, status = run(args, settings)
    print(json.dumps(result, indent=1, default=str) if args.json else text)
    return status


# ---------------------------------------------------------------- commands


def cmd_stats(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    counters = read_persisted(settings.root)
    try:
        entries = sum(1 for name in os.listdir(settings.root / KERNELS) if layout.is_key(name))
    except FileNotFoundError:
        entries = 0
    # Stat-ing every file of 10,000 entries takes seconds; gc and prune record the total they scan.
    measured = recorded_size(settings.root)
    size = measured["bytes"] if measured else None
    result = {"root": str(settings.root), "entries": entries, "size_bytes": size,
              "size_measured": measured["measured"] if measured else None,
              "max_size_bytes": settings.max_size_bytes, **counters}
    looked_up = counters["memory_hits"] + counters["disk_hits"] + counters["misses"]
    hit_rate = (counters["memory_hits"] + counters["disk_hits"]) / looked_up if looked_up else 0.0
    limit = _size(settings.max_size_bytes) if settings.max_size_bytes else "unbounded"
    when = f" (at the last gc, {_age(time.time() - measured['measured'])} ago)" if measured else " (run `kcache gc`)"
    rows = [("root", str(settings.root)), ("entries", str(entries)),
            ("size", f"{_size(size)} of {limit}{when}"), ("hit rate", f"{hit_rate:.1%}")]
    rows += [(name.replace("_", " "), f"{value:.1f}" if isinstance(value, float) else str(value))
             for name, value in counters.items()]
    return result, _format_table(["", ""], rows, show_header=False), 0


def cmd_ls(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    now = time.time()
    listing = []
    for entry in sorted(scan_entries(settings.root), key=lambda e: -e.last_used):
        meta = _meta(entry.path)
        target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
        listing.append({"key": entry.key, "kernel": meta.get("kernel", "?"), "target": target.get("arch") or
                        target.get("kind") or "-", "size_bytes": entry.size, "created": meta.get("created"),
                        "last_used": entry.last_used})
    rows = [(e["key"][:16], e["kernel"], e["target"], _size(e["size_bytes"]),
             _age(now - e["created"]) if isinstance(e["created"], (int, float)) else "-", _age(now - e["last_used"]))
            for e in listing]
    return listing, _format_table(["key", "kernel", "target", "size", "age", "last used"], rows), 0


def cmd_show(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    store = _kernels(settings)
    matches = [key for key in store.keys() if key.startswith(args.key.lower())]
    if len(matches) != 1:
        why = "no entry" if not matches else f"{len(matches)} entries"
        return {"error": f"{why} matches {args.key!r}"}, f"kcache: {why} matches {args.key!r} under {store.entries_dir}", 1
    path = store.entry_path(matches[0])
    manifest = _json_file(path / MANIFEST_NAME)
    result = {"key": matches[0], "path": str(path), "meta": _meta(path), "manifest": manifest,
              "sources": {name: str(path / name) for name in (DEVICE_SOURCE, HOST_SOURCE, LIBRARY)}}
    text = "\n".join([f"{path}", "", "meta:", json.dumps(result["meta"], indent=1, sort_keys=True), "",
                      "manifest:", json.dumps(manifest, indent=1, sort_keys=True), "", "sources:"]
                     + [f"  {name}: {p}" for name, p in result["sources"].items()])
    return result, text, 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    store = _kernels(settings)
    bad = []
    keys = store.keys()
    for key in keys:
        try:
            store.read(key)
        except CorruptEntry as corrupt:
            entry = {"key": key, "reason": corrupt.reason, "quarantined": None}
            if args.repair:
                lock = KeyLock(settings.root / layout.LOCKS / f"{key}.lock", key)
                if lock.acquire(settings.lock_timeout_s) is not None:
                    with lock:
                        moved = store.quarantine(key, f"kcache verify: {corrupt.reason}")
                    entry["quarantined"] = str(moved) if moved else None
            bad.append(entry)
    in_progress = sum(len(os.listdir(d)) for d in staging_dirs(settings.root))
    result = {"entries": len(keys), "bad": bad, "staging_in_progress": in_progress}
    lines = [f"{len(keys)} entries, {len(keys) - len(bad)} good, {len(bad)} bad; "
             f"{in_progress} staging directories (unpublished writes: never visible)"]
    lines += [f"  BAD {b['key'][:16]}: {b['reason']}" + (f" -> {b['quarantined']}" if b["quarantined"] else "")
              for b in bad]
    if bad and not args.repair:
        lines.append("run `kcache verify --repair` to quarantine them; they recompile on next use")
    unrepaired = [b for b in bad if not b["quarantined"]]
    return result, "\n".join(lines), 1 if unrepaired else 0


def cmd_prune(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    max_size = args.max_size if args.max_size is not None else settings.max_size_bytes
    max_age = args.max_age if args.max_age is not None else settings.max_age_s
    report = evict(settings.root, max_size, max_age)
    result = {"evicted": report.evicted, "freed_bytes": report.freed_bytes, "remaining": report.remaining,
              "remaining_bytes": report.remaining_bytes}
    return result, (f"evicted {report.evicted} entries ({_size(report.freed_bytes)}); "
                    f"{report.remaining} remain ({_size(report.remaining_bytes)})"), 0


def cmd_clear(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    version = installed_tilelang()
    if not args.all_versions and version is None:
        return ({"error": "TileLang is not installed"},
                "kcache: TileLang is not installed here, so no entry is of 'this' version; use --all-versions", 1)
    removed = 0
    for entry in scan_entries(settings.root):
        if args.all_versions or _meta(entry.path).get("tilelang") == version:
            removed += evict_entry(settings.root, entry.path)
    results = 0
    if args.all_versions:
        for item in _autotune_results(settings.root):
            results += evict_entry(settings.root, item)
    scope = "every version" if args.all_versions else f"TileLang {version}"
    return ({"removed_entries": removed, "removed_autotune_results": results, "scope": scope},
            f"removed {removed} kernel entries ({scope}) and {results} autotune results", 0)


def cmd_gc(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    report = collect_garbage(settings.root, settings.staging_ttl_s, settings.max_size_bytes, settings.max_age_s)
    quarantine = _remove_older(settings.root / layout.QUARANTINE, OTHER_VERSION_UNUSED_S)
    version = installed_tilelang()
    old_versions = 0
    if version is not None:
        now = time.time()
        for entry in scan_entries(settings.root):
            built_by = _meta(entry.path).get("tilelang")
            if built_by and built_by != version and now - entry.last_used > OTHER_VERSION_UNUSED_S:
                old_versions += evict_entry(settings.root, entry.path)
    result = {**vars(report), "quarantine_removed": quarantine, "other_versions_removed": old_versions}
    text = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in result.items())
    return result, text, 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    findings = doctor(settings, fix=args.fix)
    problems = [f for f in findings if f.problem and not f.fixed]
    rows = [("FIXED" if f.fixed else "PROBLEM" if f.problem else "ok", f.check, f.detail + (f" Fix: {f.fix}" if f.problem and not f.fixed and f.fix else ""))
            for f in findings]
    return [vars(f) for f in findings], _format_table(["", "check", "detail"], rows), 1 if problems else 0


def run_program(args: argparse.Namespace) -> int:
    """`kcache run SCRIPT [ARGS]` or `kcache run -m MODULE [ARGS]`: the program, unmodified, as
    `__main__`, with kcache installed into TileLang. The only command that imports TileLang."""
    import runpy

    if args.module is None and not args.argv:
        print("kcache run: name a script (kcache run train.py ...) or a module (kcache run -m pkg.main ...)",
              file=sys.stderr)
        return 2
    if args.dir:
        os.environ["KCACHE_DIR"] = args.dir
    os.environ["KCACHE_TILELANG"] = "1"  # the program's own children that import kcache install too
    from kcache.dropin.tilelang import install

    install()
    if args.module is not None:
        sys.argv = [args.module, *args.argv]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args.argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.argv[0])))  # as `python script.py` does
        runpy.run_path(args.argv[0], run_name="__main__")
    return 0


COMMANDS = {"stats": cmd_stats, "ls": cmd_ls, "show": cmd_show, "verify": cmd_verify, "prune": cmd_prune,
            "clear": cmd_clear, "gc": cmd_gc, "doctor": cmd_doctor}


# ---------------------------------------------------------------- helpers


def _kernels(settings: Settings) -> EntryStore:
    return EntryStore(settings.root, KERNELS, COMPONENTS)


def _autotune_results(root: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(root / AUTOTUNER) if not e.name.startswith(".") and e.is_dir()]
    except FileNotFoundError:
        return []


def _remove_older(directory: Path, age_s: float) -> int:
    from kcache.store.fsutil import remove_tree

    now, removed = time.time(), 0
    try:
        items = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for item in items:
        try:
            if now - item.stat(follow_symlinks=False).st_mtime > age_s:
                removed += remove_tree(Path(item.path), "removing an old quarantined entry")
        except FileNotFoundError:
            continue
    return removed


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        return {"unreadable": f"{path}: {err}"}


def _meta(entry: Path) -> dict:
    value = _json_file(entry / META)
    return value if isinstance(value, dict) else {}


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def _format_table(columns: list[str], rows: list[tuple], show_header: bool = True) -> str:
    cells = [columns, *[[str(c) for c in row] for row in rows]] if show_header else [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


if __name__ == "__main__":
    sys.exit(main())
