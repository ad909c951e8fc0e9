"""One stress worker: imports, (first generation) waits at the barrier, then loops over random operations.

Every operation is appended to the worker's JSONL log as it completes, so
the parent can account for everything even when it SIGKILLs the worker
mid-operation. Run by `python -m stress` and the benchmarks, never by hand.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import signal
import time
import traceback
from pathlib import Path
from typing import Any

from .procs import worker_handshake, worker_report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stress.worker")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--gen", type=int, default=0, help="restart generation (0: started behind the barrier)")
    p.add_argument("--root", required=True)
    p.add_argument("--kernels", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="passes over the kernels (without --until/--ops)")
    p.add_argument("--until", type=float, help="stop at this time.time()")
    p.add_argument("--ops", type=int, help="stop after this many operations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", help="append one JSON line per operation here")
    p.add_argument("--backend", choices=["kcache", "tilelang"], default="kcache")
    p.add_argument("--synthetic", action="store_true", help="fake compiler (stress.programs.synthetic), no TileLang")
    p.add_argument("--check-gpu", action="store_true", help="run each kernel against its torch reference")
    p.add_argument("--open-first", action="store_true",
                   help="open the cache before importing TileLang, as a program that calls kcache.install() first")
    return p.parse_args(argv)


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed * 1000 + args.index * 37 + args.gen)
        self.log = open(args.log, "a", buffering=1) if args.log else None  # noqa: SIM115 - lives as long as the worker
        self.ops: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.wrong = 0
        self.cache: Any = None
        if args.backend == "tilelang":
            os.environ["TILELANG_CACHE_DIR"] = args.root
        early_cache: Any = None
        if args.open_first and args.backend == "kcache" and not args.synthetic:
            import kcache  # the open starts the compile service, whose TileLang import overlaps ours

            early_cache = kcache.KernelCache(args.root)
        if args.synthetic:
            from .programs import synthetic

            self.items = [(f"k{i}", synthetic.SyntheticFunc(f"k{i}"), None) for i in range(args.kernels)]
            self.target: Any = "synthetic"
            backend: Any = synthetic
        else:
            import tilelang  # noqa: F401 - before kcache opens, so that it prepares the backend

            from .programs.kernels import CPU_TARGET, pool

            self.items = [(spec.name, spec.build(), spec) for spec in pool(args.kernels)]
            self.target = CPU_TARGET
            backend = None
        if args.backend == "kcache":
            opened = time.monotonic()  # what kcache adds before its first lookup: its import and the open
            import kcache

            self.cache = early_cache or kcache.KernelCache(args.root, backend=backend)
            self.open_s = time.monotonic() - opened
            self._count_compiles()
        else:
            self.open_s = None

    def _count_compiles(self) -> None:
        """Log compile begin/end around the backend's compile, so the parent sees interrupted ones."""
        backend = self.cache._tilelang()
        worker = self
        pid = os.getpid()

        def counted(original: Any) -> Any:
            def compile_step(func: Any, *args: Any, **kwargs: Any) -> Any:
                if os.getpid() != pid:
                    # A compile in a fork of this worker (kcache.compile.fork.caller_fork) runs the job's own
                    # compile_kernel, which this wrapper replaced in the synthetic backend's module: the
                    # compile this process asked for is counted here already.
                    return original(func, *args, **kwargs)
                name = getattr(func, "name", None) or str(func.attrs["global_symbol"])
                # A compile into a private directory (`CompileStep.compile_unsaved`): the entry this
                # process had just published could not be loaded (chaos corrupted it in between, and
                # the load quarantined it), so the caller's kernel is compiled once more, unsaved.
                out_dir = kwargs.get("out_dir")
                private = out_dir is not None and Path(out_dir).name.startswith("kcache-unsaved-")
                worker.emit({"t": "compile_begin", "kernel": name, **({"private": True} if private else {})})
                result = original(func, *args, **kwargs)
                worker.emit({"t": "compile_end", "kernel": name})
                return result

            return compile_step

        # In-process compiles go through compile_kernel, isolated ones through compile_entry.
        backend.compile_kernel = counted(backend.compile_kernel)
        backend.compile_entry = counted(backend.compile_entry)

    def emit(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(json.dumps(record) + "\n")

    def get(self, name: str, func: Any, spec: Any) -> Any:
        if self.cache is None:
            import tilelang

            return tilelang.compile(func, out_idx=spec.out_idx, target=self.target, execution_backend="tvm_ffi")
        out_idx = spec.out_idx if spec is not None else None
        return self.cache.get_or_compile(func, self.target, out_idx=out_idx)

    def one_op(self, op: str, name: str, func: Any, spec: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"t": "op", "op": op, "kernel": name}
        before = self.cache.stats() if self.cache is not None else None
        if op == "get_cold":
            self.cache.memory.clear()  # forces the disk path
        if op in ("get", "get_cold"):
            kernel = self.get(name, func, spec)
            if self.args.check_gpu and spec is not None:
                ok = _matches(spec, kernel)
                self.wrong += not ok
                if not ok:
                    self.emit({"t": "wrong", "kernel": name})
        elif op == "gc":
            self.cache.gc()
        elif op == "verify":
            record.update(self.verify_one())
        elif op == "autotune":
            record.update(self.autotune_round_trip(name, func))
        elif op == "tune":
            record.update(self.tune_once())
        if before is not None:
            after = self.cache.stats()
            record["delta"] = {k: after[k] - before[k] for k in after if after[k] != before[k] and k != "lock_wait_seconds"}
        return record

    def verify_one(self) -> dict[str, Any]:
        from kcache.errors import CorruptEntry

        store = self.cache.store
        keys = store.keys()
        if not keys:
            return {"verified": None}
        key = self.rng.choice(keys)
        try:
            inode = os.stat(store.entry_path(key)).st_ino
            store.read(key)
        except FileNotFoundError:
            return {"verified": None}  # quarantined meanwhile: a miss
        except CorruptEntry as corrupt:
            return {"verified": False, "key": key, "inode": inode, "reason": corrupt.reason}
        return {"verified": True, "key": key}

    def autotune_round_trip(self, name: str, func: Any) -> dict[str, Any]:
        """Save an AutotuneResult for this kernel (racing the other workers), then load it back whole."""
        from autotuner import AutotuneResult, ConfigOutcome, result_path

        config = {"kernel": name, "block": 128}
        result = AutotuneResult(config=config, latency=0.1, configs=[ConfigOutcome(config, "ok", 0.1)], func=func,
                                out_idx=[2], target="stress")
        path = result_path(self.args.root, f"stress-{name}")
        published = result.save_to_disk(path)
        loaded = AutotuneResult.load_from_disk(path)
        if loaded is None or loaded.config != config:
            raise AssertionError(f"the autotune result {path} did not load back whole: {loaded!r}")
        return {"autotune": "published" if published else "kept"}

    def tune_once(self) -> dict[str, Any]:
        """Tune one of TUNE_IDENTITIES identities over this run's kernels (those of one out_idx), with a
        profiler whose latencies depend on this process: every process that gets a result for an
        identity must get the same config, so only one of them may have tuned it (issue 16)."""
        import autotuner

        global _TUNE_ITEMS
        _TUNE_ITEMS = [func for _name, func, _spec in self.items]
        round_ = self.rng.randrange(TUNE_IDENTITIES)
        out_idx = self.items[round_ % len(self.items)][2].out_idx if self.items[0][2] is not None else None
        group = [i for i, (_n, _f, spec) in enumerate(self.items) if spec is None or spec.out_idx == out_idx]
        # A few configs per identity (a tune of all 64 synthetic kernels would hold a worker for seconds).
        configs = [{"index": group[(round_ * TUNE_CONFIGS + j) % len(group)]} for j in range(min(TUNE_CONFIGS, len(group)))]
        timed: list[str] = []

        def profiler(kernel: Any, inputs: Any) -> float:
            timed.append(_kernel_name(kernel))
            return random.Random(f"{os.getpid()}-{timed[-1]}").random()

        # Synthetic kernels run on no device: naming none spares the workers torch's import (seconds,
        # on every restart after a kill), which finding the current CUDA device would cost.
        result = autotuner.tune(tune_member, configs, inputs=[], target=self.target, out_idx=out_idx,
                                cache=self.cache, tune_key={"stress": round_, "out_idx": out_idx}, profiler=profiler,
                                device={"kind": "none"} if self.args.synthetic else None, verbose=False)
        return {"tune": f"{round_}:{out_idx}", "config": result.config, "tuned": bool(timed)}

    def choose(self) -> str:
        if self.cache is None:
            return "get"
        return self.rng.choices(["get", "get_cold", "verify", "gc", "autotune", "tune"],
                                weights=[55, 15, 18, 5, 5, 2])[0]

    def run(self) -> None:
        args = self.args
        if args.gen == 0:
            payload = worker_handshake()
            if args.until is not None and payload:
                args.until = float(payload)  # the load's clock starts at the barrier, not at spawn
        self.emit({"t": "start", "pid": os.getpid(), "gen": args.gen, "time": time.time()})
        count = 0
        sequence = [item for _ in range(args.rounds) for item in self.items] if not (args.until or args.ops) else None
        while True:
            if sequence is not None:
                if count >= len(sequence):
                    break
                name, func, spec = sequence[count]
                op = "get"
            else:
                # Each generation does one operation even past the end: a worker restarted after a kill
                # late in a short run still shows progress, so "made no progress" means stuck, not unlucky.
                if (args.until and time.time() >= args.until and count > 0) or (args.ops is not None and count >= args.ops):
                    break
                name, func, spec = self.rng.choice(self.items)
                op = self.choose()
            start = time.monotonic()
            try:
                record = self.one_op(op, name, func, spec)
            except Exception as err:  # every exception is reported; the parent decides it is a violation
                record = {"t": "error", "op": op, "kernel": name, "error": f"{type(err).__name__}: {err}"}
                self.errors.append(f"{name}: {type(err).__name__}: {err}\n{traceback.format_exc()[-2000:]}")
            end = time.monotonic()
            record.update(start=start, end=end, ms=(end - start) * 1e3)
            self.emit(record)
            if self.log is None:
                self.ops.append({"kernel": name, "op": op, "start": start, "end": end})
            count += 1
        self.emit({"t": "done", "stats": self.cache.stats() if self.cache is not None else None})
        worker_report({
            # With a log, the operations are there: a long run's list would fill the pipe.
            # The first errors only: all of them are in the log, and a report is one line on a pipe.
            "index": args.index, "pid": os.getpid(), "ops": [] if self.log else self.ops, "errors": self.errors[:5],
            "error_count": len(self.errors),
            "wrong_results": self.wrong, "open_s": self.open_s,
            "stats": self.cache.stats() if self.cache is not None else None,
        })


# Identities the tune operation draws from: few, so that processes tune the same one at once.
TUNE_IDENTITIES = 4
TUNE_CONFIGS = 4
_TUNE_ITEMS: list[Any] = []


def tune_member(index: int) -> Any:
    """The tune operation's kernel factory: config {"index": i} is this run's i-th kernel."""
    return _TUNE_ITEMS[index]


def _kernel_name(kernel: Any) -> str:
    prim_func = getattr(kernel, "prim_func", None)
    return str(prim_func.attrs["global_symbol"]) if prim_func is not None else kernel.name


def _matches(spec: Any, kernel: Any) -> bool:
    import torch

    inputs = spec.make_inputs("cuda")
    out = kernel(*inputs)
    expected = spec.reference(*inputs)
    torch.cuda.synchronize()
    return bool(torch.allclose(out.float(), expected.float(), rtol=spec.tolerance, atol=spec.tolerance))


def main(argv: list[str] | None = None) -> None:
    # A worker the harness finds hung gets SIGUSR1 first: every thread's stack goes to its .err log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    Worker(parse(argv)).run()


if __name__ == "__main__":
    main()
