"""Fresh interpreters started behind a barrier, speaking one JSON line each way, and the environment
they start with.

Each worker does its imports, prints `ready`, blocks until the parent
writes `go` to every worker (the start barrier: no sleeps), then works and
prints `result {...}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Where this `stress` package was imported from: a source checkout's root, or the site-packages
# it was installed into. Children start there, so `python -m stress.worker` finds the same copy.
PROJECT = Path(__file__).resolve().parent.parent


def _is_site_directory(path: Path) -> bool:
    """Whether `path` is on every child's sys.path already (a site-packages of this interpreter)."""
    import site
    import sysconfig

    candidates = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        candidates.add(site.getusersitepackages())
    return any(Path(c).resolve() == path for c in candidates if c and Path(c).exists())


class WorkerFailedToStart(RuntimeError):
    """A worker exited (or printed something else) before the barrier: its last words, and where the rest is."""

    def __init__(self, index: int, line: str, stderr: str, log: Path | None) -> None:
        last = [text for text in stderr.splitlines() if text.strip()]
        why = last[-1].strip() if last else (f"it printed {line.strip()!r}" if line.strip() else "it said nothing")
        self.index, self.stderr, self.log = index, stderr, log
        super().__init__(f"worker {index} failed before the barrier: {why}" + (f" (its stderr: {log})" if log else ""))


@dataclass
class WorkerResult:
    index: int
    returncode: int
    result: dict[str, Any] | None
    stderr: str


@contextlib.contextmanager
def environ(values: dict[str, str | None]) -> Iterator[None]:
    """This process's os.environ with `values` (None: unset) within the block, as it was after: for
    what reads its settings from the process's environment (kcache's clients, the services they start)."""
    saved = {name: os.environ.get(name) for name in values}
    _set_environ(values)
    try:
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ for a child, with `extra`; a source checkout goes first on its PYTHONPATH.

    An installed copy needs nothing there: the child's interpreter finds it in its site-packages
    (putting site-packages on PYTHONPATH would put it ahead of the standard library).
    """
    env = dict(os.environ)
    if not _is_site_directory(PROJECT):
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PROJECT), env.get("PYTHONPATH", "")] if p)
    env.update(extra or {})
    return env


class Barrier:
    """Start `count` copies of `module` (python -m), release them together, collect their results."""

    def __init__(self, module: str, count: int, args: list[str], env: dict[str, str] | None = None,
                 per_worker: Callable[[int], list[str]] | None = None,
                 stderr_path: Callable[[int], Path] | None = None) -> None:
        """`stderr_path(i)`: where worker i's stderr goes, for workers that run long and may log much
        (a pipe nobody reads until the end would fill, and block the worker); else a pipe."""

        def stderr_of(i: int) -> Any:
            return open(stderr_path(i), "w") if stderr_path else subprocess.PIPE  # noqa: SIM115 - the child's

        self.stderr_path = stderr_path
        self.procs: list[subprocess.Popen] = []
        for i in range(count):
            # Each in a session (and process group) of its own: a Ctrl-C reaches the command alone, which
            # stops its workers, and a kill of a worker's group takes the compilers it runs.
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", module, "--index", str(i), *args, *(per_worker(i) if per_worker else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr_of(i),
                text=True, env=worker_env(env), cwd=str(PROJECT), start_new_session=True,
            ))

    def wait_ready(self) -> None:
        """Until every worker printed `ready`; WorkerFailedToStart (saying why) for one that exited instead.
        The others are left to the caller, which stops them."""
        for i, proc in enumerate(self.procs):
            line = line_within(proc, READY_WITHIN_S)
            if line.strip() != "ready":
                proc.kill()
                proc.wait()
                if self.stderr_path is not None:
                    said = self.stderr_path(i).read_text(errors="replace")
                else:
                    said = proc.stderr.read() if proc.stderr else ""
                raise WorkerFailedToStart(i, line, said, self.stderr_path(i) if self.stderr_path else None)

    def release(self, payload: str = "") -> float:
        """Open the barrier (handing every worker `payload`); return the release time (time.monotonic())."""
        start = time.monotonic()
        for proc in self.procs:
            proc.stdin.write(f"go {payload}\n")
            proc.stdin.flush()
        return start

    def collect(self, timeout: float = 900) -> list[WorkerResult]:
        results = []
        for i, proc in enumerate(self.procs):
            out, err = proc.communicate(timeout=timeout)
            results.append(WorkerResult(i, proc.returncode, last_result(out), err))
        return results


READY_WITHIN_S = 600.0  # a worker's start: its imports (TileLang's, torch's) on a loaded machine


def line_within(proc: subprocess.Popen[str], seconds: float) -> str:
    """The next line `proc` prints on its stdout, waited for at most `seconds`: "" when none came by
    then (a start that hangs) or the process exited. For handshakes: one line, then a wait."""
    if not select.select([proc.stdout], [], [], seconds)[0]:
        return ""
    return proc.stdout.readline()  # type: ignore[union-attr]


def release_gated(processes: list[subprocess.Popen[str]]) -> float:
    """Open the gate of programs started with KT_GATE=1 (each prints `ready`, then waits for a line):
    every one ready, then every one sent its line at once. The release time (time.perf_counter())."""
    for process in processes:
        if line_within(process, READY_WITHIN_S).strip() != "ready":
            process.kill()
            said = process.communicate(timeout=60)[1] or ""
            raise RuntimeError(f"a gated process exited or hung before its gate: {said[-2000:]}")
    released = time.perf_counter()
    for process in processes:
        process.stdin.write("go\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
    return released


def last_result(stdout: str) -> dict[str, Any] | None:
    """The payload of the last `result {json}` line a worker printed, or None."""
    payload = None
    for line in stdout.splitlines():
        if line.startswith("result "):
            payload = json.loads(line[len("result "):])
    return payload


def run_for_result(command: list[str], what: str, env: dict[str, str] | None = None,
                   timeout: float = 900) -> Any:
    """Run a fresh interpreter (`command`, in the project, with worker_env(env)) to its end and return
    its last `result {json}`; RuntimeError naming `what`, with its output's tail, if it reports none."""
    done = subprocess.run(command, capture_output=True, text=True, env=worker_env(env), cwd=str(PROJECT),
                          timeout=timeout, check=False)
    payload = last_result(done.stdout)
    if done.returncode != 0 or payload is None:
        raise RuntimeError(f"{what} failed (exit status {done.returncode}): {done.stderr[-3000:]}\n"
                           f"its output: {done.stdout[-2000:]}")
    return payload


def worker_handshake() -> str:
    """Worker side of the barrier; returns the payload the parent sent with `go`."""
    print("ready", flush=True)
    word, _, payload = sys.stdin.readline().strip().partition(" ")
    if word != "go":
        raise SystemExit("barrier closed without a go")
    return payload


def worker_report(payload: Any) -> None:
    """What a fresh process reports to its parent: one `result JSON` line (run_for_result, Barrier)."""
    print("result " + json.dumps(payload), flush=True)
