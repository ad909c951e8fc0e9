"""Triton's compiles crashing, killed and waited for, as real programs meet them (issue 67), on the CPU
machine: a scheduler's SIGTERM to the job, a kill of the compile's process from outside, a compiler's own
abort in the compile service, a waiter past its own compile timeout, a crash record and a remote tier, a
herd meeting a crashing config. Faults and holds go into the config num_warps=4 through Triton's own stage
hook (tests/triton_faults_program.py), which travels to the worker with the compile; every firing is
recorded with the pid it ran in. Each test but the process group's SIGTERM fails on the design that forked
the caller (6b85b2e)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .helpers import PROJECT  # noqa: E402
from .redis_server import redis_server  # noqa: E402
from .test_triton import MANAGER, program_env, ptxas, runs  # noqa: E402, F401 - a fixture
from .test_triton_isolation import OK_CONFIGS, fired, printed  # noqa: E402
from .test_triton_real_programs import BOUNDED, FAULTS  # noqa: E402


class HeldCompile:
    """tests/triton_faults_program.py with the `hold` fault, in a session of its own (a job's process
    group): `held()` waits for the compile of config 4 to be under way and answers the pid it runs in."""

    def __init__(self, tmp_path: Path, ptxas: Path, lane: str) -> None:  # noqa: F811
        self.ready, self.hold, self.handled = tmp_path / "ready", tmp_path / "hold", tmp_path / "handled"
        for fifo in (self.ready, self.hold):
            if not fifo.exists():
                os.mkfifo(fifo)
        # lane "worker": a threaded program, whose compiles go to the service; "fork": a single-threaded
        # one before the service is warm, whose compiles run in forks of itself.
        threads = {"KT_THREADS": "1", "KCACHE_CALLER_FORK": "0"} if lane == "worker" else {"KT_THREADS": "0"}
        env = program_env(ptxas, tmp_path / "root", KT_FAULT="hold", KT_FIRED=str(tmp_path / "fired"),
                          KT_READY=str(self.ready), KT_HOLD=str(self.hold), KT_HANDLER=str(self.handled),
                          **threads, **BOUNDED, **MANAGER)
        self._ready = os.open(self.ready, os.O_RDONLY | os.O_NONBLOCK)  # before the writer: its open then succeeds
        self.process = subprocess.Popen([sys.executable, str(FAULTS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env, cwd=str(PROJECT), start_new_session=True)

    def held(self) -> int:
        line = b""
        while not line.endswith(b"\n"):
            readable, _, _ = select.select([self._ready], [], [], 120)
            assert readable, "the held compile never started"
            line += os.read(self._ready, 64)
        os.close(self._ready)
        return int(line)

    def finish(self) -> subprocess.CompletedProcess[str]:
        out, err = self.process.communicate(timeout=300)
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)

    def handlers_ran_in(self) -> list[int]:
        return [int(line) for line in self.handled.read_text().split()] if self.handled.exists() else []


def gone(pid: int, within_s: float = 30.0) -> bool:
    """Whether `pid` (not a child of this process: a service's worker, or the program's fork) has ended
    within `within_s` (a zombie counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)  # polled: nothing tells this process when another's child ends
    return False


@pytest.mark.parametrize("lane", ["worker", "fork"])
def test_a_sigterm_to_the_jobs_process_group_runs_the_programs_handler_once_in_the_program(
        tmp_path: Path, ptxas: Path, lane: str, runtime: Path) -> None:  # noqa: F811
    """A scheduler signals every process of a job. The program's own SIGTERM handler runs once, in the
    program, and ends it as it chose (143); the compile it was waiting for is stopped, not left behind."""
    job = HeldCompile(tmp_path, ptxas, lane)
    compiling = job.held()
    assert compiling != job.process.pid  # the compile runs away from the program
    os.killpg(job.process.pid, signal.SIGTERM)
    done = job.finish()
    assert done.returncode == 143, done.stderr[-3000:]
    assert job.handlers_ran_in() == [job.process.pid], done.stderr[-3000:]
    assert gone(compiling), f"the compile's process {compiling} outlived the program"


@pytest.mark.parametrize("lane", ["worker", "fork"])
@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGKILL])
def test_a_compile_killed_from_outside_is_that_configs_failure_once_never_remembered(
        tmp_path: Path, ptxas: Path, lane: str, sent: signal.Signals, runtime: Path) -> None:  # noqa: F811
    """An admin's kill or the OOM killer's SIGKILL of the compile's process: the program gets
    TritonCompilerCrashed for that config and lives, no handler of the program runs anywhere, and the
    kill is not remembered: the next process compiles that config."""
    job = HeldCompile(tmp_path, ptxas, lane)
    compiling = job.held()
    os.kill(compiling, sent)
    result = printed(job.finish())
    assert job.handlers_ran_in() == []
    crash = result["configs"]["4"]
    assert crash["type"] == "TritonCompilerCrashed" and sent.name in crash["message"], crash
    assert all(len(result["configs"][config]) == 64 for config in OK_CONFIGS), result
    again = subprocess.run([sys.executable, str(FAULTS)], capture_output=True, text=True, cwd=str(PROJECT), timeout=300,
                           env=program_env(ptxas, tmp_path / "root", KT_FAULT="none", KT_FIRED=str(tmp_path / "fired"),
                                           **BOUNDED, **MANAGER))
    assert len(printed(again)["configs"]["4"]) == 64, again.stderr[-2000:]  # compiled: nothing was remembered
    assert len(fired(tmp_path / "fired")) == 2  # the held compile, and this one


def test_an_abort_in_the_compile_service_is_remembered_with_its_signal(tmp_path: Path, ptxas: Path,  # noqa: F811
                                                                        runtime: Path) -> None:
    """A compiler's own crash (an abort inside the pipeline, in a worker of the service) is remembered:
    the next process raises at once, without compiling it again."""
    env = program_env(ptxas, tmp_path / "root", KT_FAULT="abort", KT_FIRED=str(tmp_path / "fired"),
                      KCACHE_CALLER_FORK="0", **BOUNDED, **MANAGER)
    first = printed(subprocess.run([sys.executable, str(FAULTS)], capture_output=True, text=True, cwd=str(PROJECT),
                                   env=env, timeout=300))
    assert fired(tmp_path / "fired") and first["pid"] not in fired(tmp_path / "fired")  # fired, in a worker
    assert "SIGABRT" in first["configs"]["4"]["message"]
    second = printed(subprocess.run([sys.executable, str(FAULTS)], capture_output=True, text=True, cwd=str(PROJECT),
                                    env=env, timeout=300))
    assert len(fired(tmp_path / "fired")) == 1 and "remembered" in second["configs"]["4"]["message"]


def test_a_process_waiting_on_anothers_compile_past_its_own_compile_timeout_is_not_killed(
        tmp_path: Path, ptxas: Path, runtime: Path) -> None:  # noqa: F811
    """A's compile of config 4 holds the key's lock (its worker held, A's timeout 120 s); B, whose own
    KCACHE_COMPILE_TIMEOUT is 2 s, misses the same key. B waits for A in its own process, where no
    compile timeout applies (the fork that once waited there was killed at its compile timeout), and
    gets A's kernel once A publishes it."""
    job = HeldCompile(tmp_path, ptxas, "worker")
    job.held()
    waiter = subprocess.Popen([sys.executable, str(FAULTS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=str(PROJECT), env=program_env(ptxas, tmp_path / "root", KT_FAULT="none",
                                                                KT_FIRED=str(tmp_path / "fired-b"),
                                                                KCACHE_COMPILE_TIMEOUT="2", KCACHE_LOG="info", **MANAGER))
    try:
        finished, _, _ = select.select([waiter.stdout], [], [], 8.0)  # 4x B's compile timeout: B must still wait
        assert not finished, "B ended while A still held the key's lock: B's wait was cut short"
    finally:
        with open(job.hold, "w") as release:  # A's compile goes on, and publishes
            release.write("go\n")
    ours, theirs = printed(job.finish()), printed(subprocess.CompletedProcess(waiter.args, waiter.wait(300),
                                                                               waiter.stdout.read(), waiter.stderr.read()))
    assert len(theirs["configs"]["4"]) == 64 and theirs["configs"] == ours["configs"], theirs


def test_a_remembered_crash_stays_on_its_machine(tmp_path: Path, ptxas: Path, runtime: Path) -> None:  # noqa: F811
    """Node A's compiler aborts on config 4 and remembers it; its good configs reach the shared Redis.
    Node B, a fresh root on the same Redis, gets those from the tier and compiles config 4 itself: a
    crash record is never uploaded (nor read from a tier), so no node's record stops another's compile."""
    with redis_server(tmp_path) as (url, _server):
        def node(name: str) -> dict:
            env = program_env(ptxas, tmp_path / name, KT_FAULT="abort", KT_FIRED=str(tmp_path / f"fired-{name}"),
                              KCACHE_REMOTE=url, KCACHE_REMOTE_SECRET="s3cret", **BOUNDED, **MANAGER)
            return printed(subprocess.run([sys.executable, str(FAULTS)], capture_output=True, text=True,
                                          cwd=str(PROJECT), env=env, timeout=300))

        first = node("node-a")
        assembled = runs(ptxas)
        stored = [key.decode() for key in redis.Redis.from_url(url).keys("*")]
        second = node("node-b")
    entries = [path.parent.name for path in (tmp_path / "node-a" / "triton").glob("*/kcache-triton.json")]
    crashes = [path.parent.name for path in (tmp_path / "node-a" / "triton").glob("*/kcache-crash.json")]
    assert len(crashes) == 1 and any(key in name for key in entries for name in stored)  # the tier's names hold keys
    assert not any(crashes[0] in name for name in stored), stored  # but not the crash's
    assert first["configs"]["4"]["type"] == second["configs"]["4"]["type"] == "TritonCompilerCrashed"
    assert "remembered" not in second["configs"]["4"]["message"]  # B's own crash, not A's record
    assert len(fired(tmp_path / "fired-node-b")) == 1 and runs(ptxas) == assembled  # the rest came from Redis


def test_a_herd_meeting_a_crashing_config_crashes_the_compiler_once(tmp_path: Path, ptxas: Path,  # noqa: F811
                                                                    runtime: Path) -> None:
    """Four processes reach the aborting config together: one compiles it and crashes; the others,
    waiting for its key's lock, find the crash remembered once they hold it, and raise it without
    compiling: the abort fires once, not four times."""
    env = program_env(ptxas, tmp_path / "root", KT_FAULT="abort", KT_FIRED=str(tmp_path / "fired"), KT_GATE="1",
                      KCACHE_CALLER_FORK="0", **BOUNDED, **MANAGER)
    herd = [subprocess.Popen([sys.executable, str(FAULTS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=str(PROJECT)) for _ in range(4)]
    for process in herd:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in herd:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = [printed(subprocess.CompletedProcess(p.args, p.wait(300), p.stdout.read(), p.stderr.read()))
               for p in herd]
    assert all(result["configs"]["4"]["type"] == "TritonCompilerCrashed" for result in results), results
    assert len(fired(tmp_path / "fired")) == 1
