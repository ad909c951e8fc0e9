"""A timed stress run: workers, chaos, a live progress line, the final integrity check, the report."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .chaos import Chaos
from .procs import PROJECT, Barrier, worker_env

LOCK_TIMEOUT_S = 300


class LogTail:
    """Reads the workers' JSONL logs incrementally (a killed worker may leave half a line)."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}
        self.records: list[dict[str, Any]] = []

    def poll(self, paths: list[Path]) -> list[dict[str, Any]]:
        fresh = []
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets.get(path, 0))
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # torn by a SIGKILL
                record["_log"] = path.name
                fresh.append(record)
        self.records += fresh
        return fresh


def entries_dir(args: Any, root: Path) -> Path:
    """Where the cache under test keeps its published kernels (chaos corrupts them there)."""
    if args.backend == "kcache":
        return root / "kernels"
    import platform
    from importlib.metadata import version

    return root / version("tilelang") / f"{sys.platform}-{platform.machine()}" / "kernels"


def own_kernel_names(args: Any) -> set[str]:
    """The names in meta.json of the kernels this run uses (what chaos may corrupt)."""
    if args.synthetic:
        return {f"k{i}" for i in range(args.kernels)}
    from .kernels import pool  # imports no TileLang

    return {spec.symbol for spec in pool(args.kernels)}


def run_stress(args: Any, root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="kcache-stress-run-"))
    # A reused root may hold earlier runs' quarantined entries: this run counts only its own.
    quarantine = root / ".quarantine"
    quarantined_before = set(os.listdir(quarantine)) if quarantine.is_dir() else set()
    until = time.time() + args.duration if args.duration else None
    per_worker_ops = -(-args.ops // args.procs) if args.ops else None
    env = {"KCACHE_LOCK_TIMEOUT": str(LOCK_TIMEOUT_S)}
    service_runtime = None
    if args.isolation:
        env["KCACHE_COMPILE_ISOLATION"] = args.isolation
    from kcache.config import Settings

    isolation = args.isolation or os.environ.get("KCACHE_COMPILE_ISOLATION") or Settings.compile_isolation
    if isolation == "server" and args.backend == "kcache":
        from .service_runtime import fresh_runtime

        service_runtime = fresh_runtime()  # the run's own compile service, found and stopped by the run
        env["XDG_RUNTIME_DIR"] = str(service_runtime)
    counter = None
    if not args.synthetic:
        from .nvcc_counter import NvccCounter

        counter = NvccCounter(run_dir)  # counts compiles independently of the cache under test
        env.update(counter.env())
    base = ["--root", str(root), "--kernels", str(args.kernels), "--seed", str(args.seed), "--backend", args.backend]
    base += ["--synthetic"] if args.synthetic else []
    base += ["--check-gpu"] if args.check_gpu else []
    base += ["--until", str(until)] if until else ["--ops", str(per_worker_ops)]
    generations: dict[int, int] = defaultdict(int)
    tail = LogTail()

    def log_path(index: int, gen: int) -> Path:
        return run_dir / f"worker-{index}-{gen}.jsonl"

    def ops_done(index: int) -> int:
        return sum(1 for r in tail.records if r["t"] in ("op", "error") and r["_log"].startswith(f"worker-{index}-"))

    def restart(index: int) -> subprocess.Popen:
        generations[index] += 1
        gen = generations[index]
        argv = [sys.executable, "-m", "stress.worker", "--index", str(index), "--gen", str(gen),
                "--log", str(log_path(index, gen)), *base]
        if per_worker_ops is not None:
            tail.poll(sorted(run_dir.glob("worker-*.jsonl")))
            argv[argv.index("--ops") + 1] = str(max(per_worker_ops - ops_done(index), 0))
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(run_dir / f"worker-{index}-{gen}.err", "w"),  # noqa: SIM115
                                env=worker_env(env), cwd=str(PROJECT))

    barrier = Barrier("stress.worker", args.procs, base, env=env,
                      per_worker=lambda i: ["--log", str(log_path(i, 0))],
                      stderr_path=lambda i: run_dir / f"worker-{i}-0.err")  # as restarts': never a full pipe
    barrier.wait_ready()
    started = time.time()
    if args.duration:
        # The duration counts from the barrier: workers importing TileLang is not load.
        until = started + args.duration
        base[base.index("--until") + 1] = str(until)
    barrier.release(str(until) if until else "")
    # Their reports go unread (the logs hold everything), but read they must be: a report that fills
    # the pipe would block its worker at exit.
    drains = [threading.Thread(target=proc.stdout.read, name=f"drain-{i}", daemon=True)
              for i, proc in enumerate(barrier.procs) if proc.stdout]
    for drain in drains:
        drain.start()
    workers = {i: p for i, p in enumerate(barrier.procs)}
    lock = threading.Lock()
    chaos = Chaos(entries_dir(args, root), workers, restart, args.kill_rate, args.corrupt_rate, args.seed, lock,
                  own_kernels=own_kernel_names(args) if args.backend == "kcache" else None,
                  server_kill_rate=args.server_kill_rate, service_runtime=service_runtime,
                  library_cuts=args.backend == "kcache" and not args.synthetic)
    chaos.start()

    deadline = (until or float("inf")) + args.hang_grace
    last_line = 0.0
    on_terminal = sys.stdout.isatty()
    crashes: list[dict[str, Any]] = []
    finished: set[int] = set()
    while True:
        with lock:
            for index, proc in list(workers.items()):
                if index in finished or proc.poll() is None:
                    continue
                if proc.returncode != 0 and not chaos.stopping.is_set():
                    # Died on its own (a SIGBUS on a corrupt entry, say): record it and keep the load going.
                    crashes.append({"index": index, "gen": generations[index], "returncode": proc.returncode})
                    workers[index] = restart(index)
                else:
                    finished.add(index)
            running = [p for p in workers.values() if p.poll() is None]
        if not running:
            break
        if time.time() > deadline:
            break
        if until and time.time() >= until and not chaos.stopping.is_set():
            chaos.stopping.set()
        tail.poll(sorted(run_dir.glob("worker-*.jsonl")))
        if time.time() - last_line >= (2 if on_terminal else 30) and not args.quiet:
            last_line = time.time()
            ops = sum(1 for r in tail.records if r["t"] == "op")
            compiles = sum(1 for r in tail.records if r["t"] == "compile_begin")
            elapsed = max(time.time() - started, 1e-9)
            line = (f"{elapsed:6.0f} s  {ops} ops  {ops / elapsed:7.1f} ops/s  kills {len(chaos.log.kills)}  "
                    f"corruptions {len(chaos.log.injections)}  compiles {compiles}")
            # One line redrawn on a terminal; a line each 30 s into a file or pipe.
            print(f"\r{line}   " if on_terminal else line, end="" if on_terminal else "\n", flush=True)
        # Polling the workers' exits paces this loop; nothing waits on it.
        chaos.stopping.wait(0.2)
    chaos.stop()
    if service_runtime is not None:
        from .service_runtime import stop_services

        stop_services(service_runtime)
    hung = []
    with lock:
        hung = [index for index, proc in workers.items() if proc.poll() is None]
        for index in hung:
            workers[index].send_signal(signal.SIGUSR1)  # its threads' stacks, into its .err log
        if hung:
            time.sleep(1.0)  # for the dumps to be written: a signal has no reply to wait on
        for index in hung:
            workers[index].kill()
            workers[index].wait()
    for drain in drains:  # every first-generation worker has exited: their pipes are at EOF
        drain.join()
    wall = time.time() - started
    if not args.quiet and on_terminal:
        print()
    tail.poll(sorted(run_dir.glob("worker-*.jsonl")))
    summary = summarize(args, root, run_dir, tail.records, chaos, generations, hung, crashes, wall,
                        quarantined_before)
    summary["nvcc_compiles"] = counter.count() if counter is not None else None
    summary["service_runtime"] = str(service_runtime) if service_runtime is not None else None
    return summary


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
        from . import synthetic as backend_module
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
