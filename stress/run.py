"""A timed stress run: workers behind a barrier, the chaos thread, a live progress line, then the final
check (stress.invariants).

However the run ends, it stops what it started before it returns or raises: the chaos thread first (it
restarts the workers it kills), then the workers (each with its process group), then the run's compile
services. Interrupted (SIGINT, SIGTERM: kcache.interruption) leaves it carrying what the run had
done: the command prints that in its one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kcache.interruption import Interrupted, signals_deferred

from .chaos import Chaos
from .invariants import LOCK_TIMEOUT_S, summarize
from .procs import PROJECT, Barrier, worker_env


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
    from .programs.kernels import pool  # imports no TileLang

    return {spec.symbol for spec in pool(args.kernels)}


class StressRun:
    """One run: `run()` starts the workers and the chaos, watches them until the end, stops everything
    and checks the invariants (the summary). `root`: the cache under load; `run_dir`: the workers'
    logs; `service_runtime`: the run's own XDG_RUNTIME_DIR, where its compile services live."""

    def __init__(self, args: Any, root: Path, run_dir: Path, service_runtime: Path) -> None:
        self.args, self.root, self.run_dir, self.service_runtime = args, root, run_dir, service_runtime
        # A reused root may hold earlier runs' quarantined entries: this run counts only its own.
        quarantine = root / ".quarantine"
        self.quarantined_before = set(os.listdir(quarantine)) if quarantine.is_dir() else set()
        self.until = time.time() + args.duration if args.duration else None
        self.per_worker_ops = -(-args.ops // args.procs) if args.ops else None
        self.env = {"KCACHE_LOCK_TIMEOUT": str(LOCK_TIMEOUT_S), "XDG_RUNTIME_DIR": str(service_runtime)}
        if args.isolation:
            self.env["KCACHE_COMPILE_ISOLATION"] = args.isolation
        self.counter = None
        if not args.synthetic:
            from .nvcc_counter import NvccCounter

            self.counter = NvccCounter(run_dir)  # counts compiles independently of the cache under test
            self.env.update(self.counter.env())
        self.base = ["--root", str(root), "--kernels", str(args.kernels), "--seed", str(args.seed),
                     "--backend", args.backend]
        self.base += ["--synthetic"] if args.synthetic else []
        self.base += ["--check-gpu"] if args.check_gpu else []
        self.base += ["--until", str(self.until)] if self.until else ["--ops", str(self.per_worker_ops)]
        self.generations: dict[int, int] = defaultdict(int)
        self.tail = LogTail()
        self.lock = threading.Lock()
        self.workers: dict[int, subprocess.Popen] = {}
        self.barrier: Barrier | None = None
        self.drains: list[threading.Thread] = []
        self.chaos: Chaos | None = None
        self.started: float | None = None  # the barrier's release: the load's clock
        self.crashes: list[dict[str, Any]] = []
        self.hung: list[int] = []

    def run(self) -> dict[str, Any]:
        try:
            self._start()
            self._watch()
        except BaseException as ended:
            with signals_deferred():  # a second signal waits: the stop must not be cut short
                self._abort()
            if isinstance(ended, Interrupted):
                ended.done = self.progress()
            raise
        with signals_deferred():
            self._finish()
        wall = time.time() - (self.started or time.time())
        if not self.args.quiet and sys.stdout.isatty():
            print()
        self.tail.poll(self._logs())
        assert self.chaos is not None
        summary = summarize(self.args, self.root, self.run_dir, self.tail.records, self.chaos, self.generations,
                            self.hung, self.crashes, wall, self.quarantined_before)
        summary["nvcc_compiles"] = self.counter.count() if self.counter is not None else None
        summary["service_runtime"] = str(self.service_runtime)
        return summary

    def progress(self) -> str:
        """What the run had done so far, in words that follow "interrupted by SIGINT" (an interrupted
        run's one line)."""
        if self.started is None:
            return f"before the load began ({self.args.procs} workers were starting); invariants not checked"
        self.tail.poll(self._logs())
        ops = sum(1 for r in self.tail.records if r["t"] == "op")
        chaos = self.chaos.log if self.chaos is not None else None
        return (f"after {time.time() - self.started:.0f} s of load, {ops} operations by {self.args.procs} workers, "
                f"{len(chaos.kills) if chaos else 0} kills, {len(chaos.injections) if chaos else 0} corruptions "
                "injected; invariants not checked")

    # ------------------------------------------------------------ start, watch, stop

    def _log_path(self, index: int, gen: int) -> Path:
        return self.run_dir / f"worker-{index}-{gen}.jsonl"

    def _logs(self) -> list[Path]:
        return sorted(self.run_dir.glob("worker-*.jsonl"))

    def _restart(self, index: int) -> subprocess.Popen:
        self.generations[index] += 1
        gen = self.generations[index]
        argv = [sys.executable, "-m", "stress.worker", "--index", str(index), "--gen", str(gen),
                "--log", str(self._log_path(index, gen)), *self.base]
        if self.per_worker_ops is not None:
            self.tail.poll(self._logs())
            done = sum(1 for r in self.tail.records
                       if r["t"] in ("op", "error") and r["_log"].startswith(f"worker-{index}-"))
            argv[argv.index("--ops") + 1] = str(max(self.per_worker_ops - done, 0))
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(self.run_dir / f"worker-{index}-{gen}.err", "w"),  # noqa: SIM115
                                env=worker_env(self.env), cwd=str(PROJECT), start_new_session=True)

    def _start(self) -> None:
        args = self.args
        self.barrier = Barrier("stress.worker", args.procs, self.base, env=self.env,
                               per_worker=lambda i: ["--log", str(self._log_path(i, 0))],
                               stderr_path=lambda i: self.run_dir / f"worker-{i}-0.err")  # never a full pipe
        self.workers = dict(enumerate(self.barrier.procs))
        self.barrier.wait_ready()
        self.started = time.time()
        if args.duration:
            # The duration counts from the barrier: workers importing TileLang is not load.
            self.until = self.started + args.duration
            self.base[self.base.index("--until") + 1] = str(self.until)
        self.barrier.release(str(self.until) if self.until else "")
        # Their reports go unread (the logs hold everything), but read they must be: a report that fills
        # the pipe would block its worker at exit.
        self.drains = [threading.Thread(target=proc.stdout.read, name=f"drain-{i}", daemon=True)
                       for i, proc in enumerate(self.barrier.procs) if proc.stdout]
        for drain in self.drains:
            drain.start()
        self.chaos = Chaos(entries_dir(args, self.root), self.workers, self._restart, args.kill_rate,
                           args.corrupt_rate, args.seed, self.lock,
                           own_kernels=own_kernel_names(args) if args.backend == "kcache" else None,
                           server_kill_rate=args.server_kill_rate, service_runtime=self.service_runtime,
                           library_cuts=args.backend == "kcache" and not args.synthetic)
        self.chaos.start()

    def _watch(self) -> None:
        """Until every worker finished (restarting those that crashed on their own), or the hang grace
        past the end ran out; a progress line meanwhile."""
        args, chaos = self.args, self.chaos
        assert chaos is not None and self.started is not None
        deadline = (self.until or float("inf")) + args.hang_grace
        last_line = 0.0
        on_terminal = sys.stdout.isatty()
        finished: set[int] = set()
        while True:
            with self.lock:
                for index, proc in list(self.workers.items()):
                    if index in finished or proc.poll() is None:
                        continue
                    if proc.returncode != 0 and not chaos.stopping.is_set():
                        # Died on its own (a SIGBUS on a corrupt entry, say): record it and keep the load going.
                        self.crashes.append({"index": index, "gen": self.generations[index],
                                             "returncode": proc.returncode})
                        self.workers[index] = self._restart(index)
                    else:
                        finished.add(index)
                running = [p for p in self.workers.values() if p.poll() is None]
            if not running or time.time() > deadline:
                break
            if self.until and time.time() >= self.until and not chaos.stopping.is_set():
                chaos.stopping.set()
            self.tail.poll(self._logs())
            if time.time() - last_line >= (2 if on_terminal else 30) and not args.quiet:
                last_line = time.time()
                ops = sum(1 for r in self.tail.records if r["t"] == "op")
                compiles = sum(1 for r in self.tail.records if r["t"] == "compile_begin")
                elapsed = max(time.time() - self.started, 1e-9)
                line = (f"{elapsed:6.0f} s  {ops} ops  {ops / elapsed:7.1f} ops/s  kills {len(chaos.log.kills)}  "
                        f"corruptions {len(chaos.log.injections)}  compiles {compiles}")
                # One line redrawn on a terminal; a line each 30 s into a file or pipe.
                print(f"\r{line}   " if on_terminal else line, end="" if on_terminal else "\n", flush=True)
            # Polling the workers' exits paces this loop; nothing waits on it.
            chaos.stopping.wait(0.2)

    def _finish(self) -> None:
        """The end of a run that ran its course: the chaos stopped, the services stopped (a service
        identifying the toolchain could write into .locks after the final gc), hung workers' stacks
        dumped into their .err logs, then killed."""
        assert self.chaos is not None
        self.chaos.stop()
        from .service_runtime import stop_services

        stop_services(self.service_runtime)
        with self.lock:
            self.hung = [index for index, proc in self.workers.items() if proc.poll() is None]
            for index in self.hung:
                self.workers[index].send_signal(signal.SIGUSR1)  # its threads' stacks, into its .err log
            if self.hung:
                time.sleep(1.0)  # for the dumps to be written: a signal has no reply to wait on
            for index in self.hung:
                self._kill(self.workers[index])
        for drain in self.drains:  # every first-generation worker has exited: their pipes are at EOF
            drain.join()

    def _abort(self) -> None:
        """The end of a run cut short (an interrupt, a worker that never started): the chaos stopped
        first (it would restart the workers killed here), then every worker with its process group. The
        command's scope (stress.command_scope) stops whatever else it started."""
        if self.chaos is not None and self.chaos.is_alive():
            self.chaos.stop()
        for proc in [*(self.barrier.procs if self.barrier else []), *self.workers.values()]:
            self._kill(proc)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """SIGKILL a worker and its process group (the compilers it runs), and reap it."""
        if proc.returncode is None:  # not reaped yet: its pid, and so its group's id, are still its own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own group (start_new_session)
        proc.kill()
        proc.wait()
