"""Where a fresh process's disk hit spends its time: a diagnostic beside `python -m stress.bench --only
disk` and `--only warm`, not a goal (issue 39's breakdown).

    python -m stress.bench --only disk --profile [--repeats 10] [--json out.json]

One kernel (the bench's add) is compiled into a kcache root and into TileLang's own cache; then fresh
processes, kcache's, TileLang's and the floor's taking turns, each import, open and ask for it once.
Each step is timed by wrapping its function in the sampled process, which keeps its events in memory
until it ends (before 2026-11-28 04:45 UTC each step wrote its event to the log file inside the steps
around it: about 0.02 ms a step on the CPU machine, seven steps in kcache's call, two in TileLang's):
- outside the call: `import tilelang`, `import kcache`, opening the `KernelCache`;
- kcache's call: the request (target, options, the key: the PrimFunc's TVMScript and its sha256),
  the entry's read (trust on each descriptor, the manifest, every file's size and sha256), the ELF
  check, the memfd copy and `dlopen`, TileLang's wrapper (the rest of the load), and the rest;
- TileLang's call: its key, its load from disk, and the rest;
- the floor: a third process that opens the cache as kcache's does and then calls only what a hit
  that keeps every check must do, each timed: TileLang's target resolution, the key (the compile
  context, the PrimFunc's TVMScript, its sha256), the store's read and verification, and kcache's
  loader (ELF check, memfd copy, `dlopen`, TileLang's wrapper). The store object is made before the
  clock starts. What kcache's call takes beyond the floor is the rest of its pipeline (the memory
  tier, the options, the statistics); a goal under the floor cannot be met without dropping a
  check or TileLang's own target resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .events import LOG_ENV, events_of, flush_events, hold_events, log_event, timed_steps


def _instrument_kcache() -> None:
    import kcache.tilelang.loader as loader
    from kcache.cache.request import KernelRequest
    from kcache.store import exec_copy
    from kcache.store.entries import EntryStore
    from kcache.tilelang import backend

    timed_steps([
        (KernelRequest, "build", "request and key"),
        (backend, "key_fields", "key: its fields (TVMScript of the PrimFunc)"),
        (EntryStore, "read", "read and verify (trust, manifest, sha256)"),
        (backend, "load_kernel", "load (ELF, memfd, dlopen, wrapper)"),
        (loader, "require_loadable", "load: ELF check"),
        (exec_copy, "_from_memfd", "load: memfd copy and dlopen"),
        (loader, "_load_descriptor_path", "load: dlopen"),
    ])


def _instrument_tilelang() -> None:
    from tilelang.cache.kernel_cache import KernelCache

    timed_steps([(KernelCache, "_generate_key", "key (TileLang)"),
                 (KernelCache, "_load_kernel_from_disk", "load from disk (TileLang)")])


def child(which: str, root: str) -> None:
    hold_events()  # written at the end: logging a step costs the steps around it about 1 us
    try:
        _sample_steps(which, root)
    finally:
        flush_events()


def _sample_steps(which: str, root: str) -> None:
    clock = time.time
    start = clock()
    import tilelang

    log_event("import tilelang", start, clock())
    from stress.programs.kernels import CPU_TARGET, pool

    func = pool(1)[0].build()
    if which == "tilelang":
        _instrument_tilelang()
        start = clock()
        tilelang.compile(func, out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi")
        log_event("call", start, clock())
        return
    start = clock()
    import kcache

    log_event("import kcache", start, clock())
    start = clock()
    cache = kcache.KernelCache(root)
    log_event("open KernelCache", start, clock())
    if which == "floor":
        _floor(cache, func, CPU_TARGET)
        return
    _instrument_kcache()
    start = clock()
    cache.get_or_compile(func, CPU_TARGET, out_idx=[2])
    log_event("call", start, clock())
    if cache.stats()["disk_hits"] != 1:
        raise SystemExit("not a disk hit")


def _floor(cache: Any, func: Any, target: dict[str, str]) -> None:
    """Only the steps a hit that keeps every check needs, each logged, then their sum as "call"."""
    from kcache.keys import derive_key

    clock = time.time
    backend, store = cache._tilelang(), cache.store
    toolchain = cache._toolchain_fingerprint(backend)  # memoized at the open
    begun = clock()
    resolved = backend.resolve_target(target, "tvm_ffi")
    pass_configs = backend.normalize_pass_configs(None)
    resolved_at = clock()
    fields = backend.key_fields(func, resolved, [2], pass_configs, None, toolchain, backend.capture_context())
    key = derive_key(fields)
    keyed_at = clock()
    files = store.read(key)
    read_at = clock()
    if files is None:
        raise SystemExit("the floor's key is not the one kcache's call asks for")
    backend.load_kernel(func, store.entry_path(key), files, resolved, [2], pass_configs, None)
    loaded_at = clock()
    for what, start, end in (("floor: TileLang's target resolution and the options", begun, resolved_at),
                             ("floor: the key (context, TVMScript, sha256)", resolved_at, keyed_at),
                             ("floor: read and verify", keyed_at, read_at),
                             ("floor: load (ELF, memfd, dlopen, wrapper)", read_at, loaded_at),
                             ("call", begun, loaded_at)):
        log_event(what, start, end)


def _sample(which: str, root: Path, env: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for event in events_of("disk", [which, str(root)], env, timeout=300):
        out[event["what"]] = out.get(event["what"], 0.0) + event["end"] - event["start"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.profiles.disk")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    from ..suite.children import bytecode_as_installed
    from ..suite.timing import take_turns

    work = Path(tempfile.mkdtemp(prefix="kcache-hit-phases-"))
    root = work / "kcache"
    env = {**bytecode_as_installed(), LOG_ENV: str(work / "events.jsonl"),
           "TILELANG_CACHE_DIR": str(work / "tilelang"), "KCACHE_COMPILE_ISOLATION": "inprocess"}
    for which in ("kcache", "tilelang"):  # the misses that fill both caches
        subprocess.run([sys.executable, "-m", "stress.bench.profiles.disk", "--child", which, str(root)],
                       env={**os.environ, **env}, capture_output=True, timeout=600)
    samples = take_turns(("kcache", "tilelang", "floor"), args.repeats, lambda which, _turn: _sample(which, root, env))
    report: dict[str, dict[str, float]] = {}
    for which, runs in samples.items():
        print(f"\n{which}: medians of {len(runs)} fresh processes, ms")
        report[which] = {}
        for what in runs[0]:
            value = statistics.median(run.get(what, 0.0) for run in runs) * 1000
            report[which][what] = round(value, 3)
            print(f"  {value:9.3f}  {what}")
    ratio = report["kcache"]["call"] / report["tilelang"]["call"]
    floor = report["floor"]["call"] / report["tilelang"]["call"]
    print(f"\nthe call, kcache / TileLang: {ratio:.3f}")
    print(f"the floor of a hit that keeps every check, / TileLang: {floor:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"repeats": args.repeats, "ms": report, "call_ratio": round(ratio, 4),
                                         "floor_ratio": round(floor, 4)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
