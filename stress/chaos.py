"""The chaos thread: SIGKILLs random workers mid-operation (and restarts them), corrupts published files.

Corruption models what a new reader finds on a bad disk: a file of a
published entry is truncated, has a byte flipped, or is gone. The damaged
copy replaces the file by rename (a delete is an unlink), so processes that
already mapped the old file keep valid pages: truncating a mapped .so in
place would SIGBUS its users, a fault of the harness rather than of the
cache. Each injection records the entry directory's inode, which a
quarantine rename keeps, so the end of the run can tell whether it was
detected.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kcache.store.manifest import build_manifest


@dataclass
class Injection:
    key: str
    inode: int
    file: str
    mode: str
    time: float


@dataclass
class ChaosLog:
    kills: list[dict] = field(default_factory=list)
    server_kills: list[dict] = field(default_factory=list)
    injections: list[Injection] = field(default_factory=list)


class Chaos(threading.Thread):
    def __init__(self, kernels_dir: Path, workers: dict[int, subprocess.Popen], restart: Callable[[int], subprocess.Popen],
                 kill_rate: float, corrupt_rate: float, seed: int, lock: threading.Lock,
                 own_kernels: set[str] | None = None, server_kill_rate: float = 0.0,
                 service_runtime: Path | None = None, library_cuts: bool = False) -> None:
        super().__init__(daemon=True, name="chaos")
        self.kernels_dir = kernels_dir
        self.workers = workers
        self.restart = restart
        self.kill_rate = kill_rate
        self.corrupt_rate = corrupt_rate
        # SIGKILLs of the run's compile service (its runtime directory finds it); clients fall back.
        self.server_kill_rate = server_kill_rate if service_runtime is not None else 0.0
        self.service_runtime = service_runtime
        # Also cut kernel.so short and rewrite the manifest to match (the hash then passes; only the
        # loader's structure check sees it). Real TileLang entries only: a synthetic library is no ELF.
        self.library_cuts = library_cuts
        self.rng = random.Random(seed)
        self.lock = lock
        # Only entries of these kernels (the run's own) are corrupted: the root may be a real cache.
        self.own_kernels = own_kernels
        self.log = ChaosLog()
        self.stopping = threading.Event()

    def run(self) -> None:
        total = self.kill_rate + self.corrupt_rate + self.server_kill_rate
        if total <= 0:
            return
        # Event.wait paces the faults (a Poisson process); it synchronizes nothing.
        while not self.stopping.wait(self.rng.expovariate(total)):
            pick = self.rng.random() * total
            if pick < self.kill_rate:
                self.kill_one()
            elif pick < self.kill_rate + self.server_kill_rate:
                self.kill_server()
            else:
                self.corrupt_one()

    def kill_server(self) -> None:
        from .service_runtime import service_pids

        assert self.service_runtime is not None
        pids = service_pids(self.service_runtime)
        if not pids:
            return  # none running now (killed, idle, or not started again yet)
        pid = self.rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.log.server_kills.append({"pid": pid, "time": time.time()})

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def kill_one(self) -> None:
        with self.lock:
            alive = [i for i, p in self.workers.items() if p.poll() is None]
            if not alive:
                return
            index = self.rng.choice(alive)
            proc = self.workers[index]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            self.log.kills.append({"index": index, "pid": proc.pid, "time": time.time()})
            self.workers[index] = self.restart(index)

    def corrupt_one(self) -> None:
        try:
            keys = os.listdir(self.kernels_dir)
            if not keys:
                return
            key = self.rng.choice(keys)
            entry = self.kernels_dir / key
            if self.own_kernels is not None and json.loads((entry / "meta.json").read_bytes()).get("kernel") not in self.own_kernels:
                return
            inode = os.stat(entry).st_ino
            name = self.rng.choice(sorted(os.listdir(entry)))
            mode = self.rng.choice(["truncate", "flip", "delete", *(["library-cut"] if self.library_cuts else [])])
            if mode == "library-cut":
                name = "kernel.so"
            victim = entry / name
            if mode == "library-cut":
                library = victim.read_bytes()
                self._replace(entry, key, name, library[: len(library) // 2])
                # Injected from here on: a worker can see the cut library before the manifest follows
                # (and quarantine the entry, so the manifest's rename finds no entry).
                self.log.injections.append(Injection(key, inode, name, mode, time.time()))
                self._replace(entry, key, "manifest.json", build_manifest(entry))
                return
            elif mode == "delete":
                os.unlink(victim)
            else:
                data = bytearray(victim.read_bytes())
                if mode == "truncate" or not data:
                    data = data[: len(data) // 2]
                else:
                    data[self.rng.randrange(len(data))] ^= 0xFF
                damaged = entry.parent / f".chaos-{key}-{os.getpid()}"
                damaged.write_bytes(bytes(data))
                try:
                    os.rename(damaged, victim)
                finally:
                    if damaged.exists():
                        damaged.unlink()
        except (FileNotFoundError, ValueError):
            return  # quarantined meanwhile, or its meta is damaged: nothing was injected
        self.log.injections.append(Injection(key, inode, name, mode, time.time()))

    @staticmethod
    def _replace(entry: Path, key: str, name: str, data: bytes) -> None:
        damaged = entry.parent / f".chaos-{key}-{os.getpid()}"
        damaged.write_bytes(data)
        try:
            os.rename(damaged, entry / name)
        finally:
            if damaged.exists():
                damaged.unlink()
