"""The end of a stress run: the final integrity check over the root, the invariants (docs/stress.md)
checked against the workers' logs and the chaos thread's own log, and the summary the report prints."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .chaos import Chaos

# A worker's lock waits are bounded by this (KCACHE_LOCK_TIMEOUT): an operation longer than it is a hang.
LOCK_TIMEOUT_S = 300


def summarize(args: Any, root: Path, run_dir: Path, records: list[dict[str, Any]], chaos: Chaos,
              generations: dict[int, int], hung: list[int], crashes: list[dict[str, Any]], wall: float,
              quarantined_before: set[str]) -> dict[str, Any]:
    from kcache import KernelCache
    from kcache.config import Settings
    from kcache.errors import CorruptEntry
    from kcache.store.elf import require_loadable

    violations: list[str] = []
    ops = [r for r in records if r["t"] == "op"]
    errors = [r for r in records if r["t"] == "error"]

    # Compiles: all begun, and those lost to a kill: begun during the operation a
    # killed generation never finished (killed while compiling or publishing).
    begun = Counter(r["_log"] for r in records if r["t"] == "compile_begin")
    killed_logs = {f"worker-{k['index']}-{g}.jsonl" for k in chaos.log.kills for g in range(generations[k["index"]] + 1)}
    unfinished: Counter = Counter()
    for r in records:
        if r["_log"] in killed_logs:
            if r["t"] == "compile_begin":
                unfinished[r["_log"]] += 1
            elif r["t"] in ("op", "error", "done"):
                unfinished[r["_log"]] = 0
    interrupted = sum(unfinished.values())
    compiles = sum(begun.values())
    quarantine = root / ".quarantine"
    this_run = set(os.listdir(quarantine)) - quarantined_before if quarantine.exists() else set()
    quarantined_by_workers = {os.stat(quarantine / n).st_ino for n in this_run}

    # The final integrity check: every published entry verifies, or was corrupted by chaos.
    if args.synthetic:
        from .programs import synthetic as backend_module
    else:
        backend_module = None
    # It compiles nothing, so no compile service: opened before `import tilelang`, a cache in server
    # mode would have the service identify the toolchain in the background, whose lock file could
    # then appear in .locks after the final gc below.
    cache = KernelCache(root, backend=backend_module,
                        settings=dataclasses.replace(Settings.from_env(root), compile_isolation="inprocess"))
    injected_inodes = {i.inode for i in chaos.log.injections}
    found_at_sweep = set()
    for key in cache.store.keys():
        entry = cache.store.entry_path(key)
        try:
            inode = os.stat(entry).st_ino
            files = cache.store.read(key)
            if files is not None and not args.synthetic:
                require_loadable(str(entry), files)  # a library cut short with its manifest rewritten
        except FileNotFoundError:
            continue
        except CorruptEntry as corrupt:
            if inode in injected_inodes:
                found_at_sweep.add(inode)
                cache.store.quarantine(key, f"stress final check: {corrupt.reason}")
            else:
                violations.append(f"published entry {entry} fails verification without injected corruption: {corrupt.reason}")
    # Counted by injection (two injections into one entry are two), so the parts add up to the whole.
    by_workers = sum(1 for i in chaos.log.injections if i.inode in quarantined_by_workers)
    at_final_check = sum(1 for i in chaos.log.injections
                         if i.inode in found_at_sweep and i.inode not in quarantined_by_workers)
    detected = by_workers + at_final_check
    undetected = len(chaos.log.injections) - detected
    if undetected:
        violations.append(f"{undetected} injected corruptions were never detected")

    # Partial entries observed by workers' verify operations, not caused by chaos.
    for r in ops:
        if r.get("verified") is False and r.get("inode") not in injected_inodes:
            violations.append(f"worker saw a corrupt entry chaos did not cause: {r.get('key')}: {r.get('reason')}")

    # A compile into a private directory follows a publish whose entry chaos corrupted before its
    # writer loaded it (the load quarantined it: a repair); the entry's key compiles again later.
    private = sum(1 for r in records if r["t"] == "compile_begin" and r.get("private"))
    bound = args.kernels + interrupted + len(quarantined_by_workers)
    if args.backend == "kcache" and compiles - private > bound:
        violations.append(f"{compiles - private} compiles > {args.kernels} keys + {interrupted} interrupted + "
                          f"{len(quarantined_by_workers)} repairs")
    if args.backend == "kcache" and private > len(quarantined_by_workers):
        violations.append(f"{private} private compiles > {len(quarantined_by_workers)} repairs")

    # Final gc: nothing left behind (every worker ran on this host, so dead writers' staging goes at once).
    cache.gc()
    from kcache.maintenance.gc import lock_dirs, staging_dirs

    for path in [*staging_dirs(root), *lock_dirs(root)]:
        if args.backend == "kcache" and path.exists() and os.listdir(path):
            violations.append(f"{len(os.listdir(path))} item(s) left in {path} after the final gc")

    # Tune once (issue 16): per tune identity, every process that got a result got the same config, and
    # at most one finished process benchmarked it (a killed tuner never reports; its heir does).
    tunes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ops:
        if r["op"] == "tune":
            tunes[r["tune"]].append(r)
    for identity, done in sorted(tunes.items()):
        picks = {json.dumps(r["config"], sort_keys=True) for r in done}
        if len(picks) > 1:
            violations.append(f"tune {identity}: {len(done)} processes got {len(picks)} different configs: {sorted(picks)}")
        tuned = sum(1 for r in done if r["tuned"])
        if tuned > 1:
            violations.append(f"tune {identity}: {tuned} processes benchmarked it (one tune per identity)")

    for r in errors:
        violations.append(f"unexpected exception in {r['_log']}: {r['error']}")
    for crash in crashes:
        violations.append(f"worker {crash['index']} (generation {crash['gen']}) crashed with exit status {crash['returncode']}")
    if hung:
        violations.append(f"workers {hung} did not finish (deadlock or hang; their stacks are in their .err logs)")
    for index in range(args.procs):
        if not any(r["_log"].startswith(f"worker-{index}-") for r in ops):
            violations.append(f"worker {index} made no progress")
    slowest = max((r["ms"] for r in ops), default=0.0)
    if slowest > LOCK_TIMEOUT_S * 1e3:
        violations.append(f"an operation took {slowest / 1e3:.0f} s (lock waits unbounded?)")
    wrong = sum(1 for r in records if r["t"] == "wrong")
    if wrong:
        violations.append(f"{wrong} wrong results on the GPU")

    by_type: dict[str, list[float]] = defaultdict(list)
    for r in ops:
        by_type[r["op"]].append(r["ms"])
    outcome = Counter()
    for r in ops:
        outcome.update(r.get("delta", {}))
    return {
        "procs": args.procs, "kernels": args.kernels, "backend": args.backend, "synthetic": args.synthetic,
        "root": str(root), "run_dir": str(run_dir), "wall_s": round(wall, 2),
        "ops": len(ops), "ops_per_s": round(len(ops) / max(wall, 1e-9), 1),
        "ops_by_type": {k: {"count": len(v), "p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)} for k, v in sorted(by_type.items())},
        "hits": {"memory": outcome["memory_hits"], "disk": outcome["disk_hits"], "remote": outcome["remote_hits"]},
        "misses": outcome["misses"], "compiles": compiles, "compiles_interrupted": interrupted,
        "repairs": len(quarantined_by_workers),
        "lost_races": outcome["lost_races"], "lock_waits": outcome["lock_waits"],
        "kills": len(chaos.log.kills), "server_kills": len(chaos.log.server_kills), "crashes": len(crashes),
        "corruptions": {"injected": len(chaos.log.injections), "detected": detected,
                        "by_workers": by_workers, "at_final_check": at_final_check,
                        "by_mode": dict(Counter(i.mode for i in chaos.log.injections))},
        "wrong_results": wrong, "results_checked": bool(args.check_gpu),
        "tunes": {"identities": len(tunes), "results": sum(len(v) for v in tunes.values()),
                  "tuned": sum(1 for v in tunes.values() for r in v if r["tuned"])},
        "invariants": {"checked": checked_invariants(args), "violations": violations, "pass": not violations},
    }


def checked_invariants(args: Any) -> list[str]:
    """The invariants this run checked, as the report lists them (docs/stress.md)."""
    checked = ["no partial entry observed", "every published entry verifies or was corrupted by chaos"]
    if args.backend == "kcache":
        checked += ["compiles within kernels + interrupted + repairs", "staging and locks empty after gc"]
        checked += ["one config per tune identity, from one tune"]
    checked += ["every injected corruption detected", "no unexpected exception, crash or hang",
                "every worker made progress", "no operation over the lock timeout"]
    if args.check_gpu:
        checked.append("no wrong result on the GPU")
    return checked


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 3) if ordered else 0.0
