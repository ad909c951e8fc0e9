"""Triton's isolated compiles in programs as they really run (issue 67), on the CPU machine (Triton
compiles for sm_90 without a GPU): threads holding locks, an S3 tier in use, signal handlers and a
scheduler's signals, kills from outside, a hardened machine. Each finding of the review that asked for
these was reproduced on the design that forked the caller, and the tests of threads, the S3 tier, kills,
the lock's wait and the copies fail on it; the process group's SIGTERM guards what held already.

The back half of a compile runs in a worker of the compile service (kcache.triton.stages), or, while
the service is not warm, in a fork of a single-threaded caller. Faults and holds are injected into the
config num_warps=4 through Triton's own stage hook (tests/triton_faults_program.py), which travels to
the worker with the compile; every firing is recorded with the pid it ran in."""

from __future__ import annotations

import json
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

from .faults import needs_root  # noqa: E402
from .helpers import PROJECT  # noqa: E402
from .redis_server import redis_server  # noqa: E402
from .s3_server import s3_server  # noqa: E402
from .test_triton import MANAGER, SHARED_OBJECT, compile_in_fresh_process, program_env, ptxas, runs  # noqa: E402, F401 - a fixture
from .test_triton_isolation import OK_CONFIGS, fired, printed  # noqa: E402

FAULTS = Path(__file__).with_name("triton_faults_program.py")
THREADS = Path(__file__).with_name("triton_threads_program.py")
# A compile that hangs shows up as a timeout within this, not after the 10 minutes of the default.
BOUNDED = {"KCACHE_COMPILE_TIMEOUT": "120"}


def test_threads_racing_first_compiles_beside_threads_holding_locks_compile_what_plain_triton_does(
        tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """The review's deadlock: three threads' first compiles at once, while another thread is half way
    through an import and another holds a lock of the program's and a logging handler's lock. A fork of
    this process would inherit those locks held; under kcache every compile finishes, with the cubins
    plain Triton builds, and the holders still held their locks when the compiles ended."""
    slow = tmp_path / "slow"
    slow.mkdir()
    gate = tmp_path / "import-gate"
    os.mkfifo(gate)
    (slow / "kt_slow_module.py").write_text(f"with open({str(gate)!r}) as gate:\n    gate.readline()\n")

    def threaded(**env: str) -> dict:
        done = subprocess.run([sys.executable, str(THREADS)], capture_output=True, text=True, cwd=str(PROJECT),
                              timeout=300, env=program_env(ptxas, tmp_path / "root", KT_SLOW_DIR=str(slow),
                                                           KT_SLOW_MODULE="kt_slow_module", KT_IMPORT_GATE=str(gate),
                                                           KCACHE_LOG="info", **BOUNDED, **env))
        return printed(done) | {"stderr": done.stderr}

    plain = threaded()
    kcache = threaded(**MANAGER)
    assert kcache["importing_meanwhile"] and kcache["holding_meanwhile"], kcache  # the locks were held throughout
    assert kcache["cubins"] == plain["cubins"] and all(len(cubin) == 64 for cubin in plain["cubins"].values()), kcache
    assert kcache["stderr"].count("(in a worker)") == 3, kcache["stderr"]  # each compiled away from the program


S3_PROGRAM = """
import json
from triton.runtime.build import compile_module_from_src
from stress.programs.triton_program import compile_kernel
# As Triton's driver starts in a GPU program (CudaUtils): its module is a lone file, looked up in the tier.
SOURCE = (
    "#include <Python.h>\\n"
    "static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, \\"kcache_s3_probe\\", NULL, -1, NULL};\\n"
    "PyMODINIT_FUNC PyInit_kcache_s3_probe(void) { return PyModule_Create(&module); }\\n")
compile_module_from_src(SOURCE, "kcache_s3_probe")
print(json.dumps({name: compile_kernel(name) for name in ("add", "matmul")}))
"""


def test_a_compile_beside_an_s3_tier_in_use_shares_it_with_the_next_node(tmp_path: Path, ptxas: Path) -> None:  # noqa: F811
    """The review's S3 finding: with the program's S3 client in use (its driver's module looked up in the
    tier at its start, as a GPU program's Triton does), a fork of the caller inherited that client, whose
    runtime's threads do not survive a fork, and each compile hung on the tier's timeout; no group
    reached the bucket. Now the claim, the fetch and the upload are the caller's: node A compiles two
    kernels, and node B, a fresh root on the same bucket, compiles neither."""
    with s3_server() as server:
        remote = {**server.env, "KCACHE_REMOTE": server.url("triton"), "KCACHE_REMOTE_SECRET": "s3cret", **BOUNDED}
        done = subprocess.run([sys.executable, "-c", S3_PROGRAM], capture_output=True, text=True, cwd=str(PROJECT),
                              env=program_env(ptxas, tmp_path / "node-a", **remote, **MANAGER), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "unavailable" not in done.stderr, done.stderr[-3000:]  # the tier answered every request
        assert runs(ptxas) == 2
        later = compile_in_fresh_process("add,matmul", program_env(ptxas, tmp_path / "node-b", **remote, **MANAGER))
    compiled = json.loads(done.stdout.splitlines()[-1])
    assert {name: later[name] for name in compiled} == compiled and runs(ptxas) == 2  # from the bucket, no compile


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


@needs_root
def test_on_a_cis_hardened_machine_tritons_driver_modules_load_with_nothing_set(tmp_path: Path) -> None:
    """/tmp and /dev/shm mounted noexec and XDG_RUNTIME_DIR unset (the CIS layout; cron and batch jobs),
    in a mount namespace of the test's own: plain Triton loads its driver's module from its cache in
    the home; so does kcache, from memory, with nothing set."""
    home = Path(f"/var/tmp/kcache-hardened-{os.getpid()}")  # off /tmp, which the namespace hides
    home.mkdir(mode=0o700)
    try:
        results = {}
        for lane, env in (("plain", {"TRITON_CACHE_DIR": str(home / "plain")}),
                          ("kcache", {"KCACHE_DIR": str(home / "root"), **MANAGER})):
            environment = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "KCACHE_EXEC_DIR")}
            environment.update(env, PYTHONPATH=str(PROJECT))
            if lane == "plain":
                environment.pop("TRITON_CACHE_MANAGER", None)
            script = ("mount -t tmpfs -o noexec,nosuid tmpfs /tmp && mount -t tmpfs -o noexec,nosuid tmpfs /dev/shm "
                      f"&& exec {sys.executable} -c \"$0\"")
            done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                                   SHARED_OBJECT], capture_output=True, text=True, env=environment, timeout=300)
            assert done.returncode == 0, (lane, done.stderr[-3000:])
            results[lane] = json.loads(done.stdout.splitlines()[-1])
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=True)
    assert results["plain"]["answer"] == results["kcache"]["answer"] == 42
    assert results["kcache"]["file"].startswith("/proc/self/fd/"), results  # a private copy, in memory


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


def test_a_private_copy_is_its_own_bytes_though_its_directory_is_swapped(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's swap: the directory of a process's copies is renamed away and another put in its
    place, with a file of the copy's name (as a member of a group KCACHE_EXEC_DIR without the sticky
    bit could). The path kcache handed out still reads the bytes it checked, from memory."""
    from kcache.triton import private

    monkeypatch.setattr(private, "_copies", private._Copies())  # a directory of this test's own
    monkeypatch.setattr(private, "_bases", lambda: [tmp_path])
    path = private.private_copy("ab" * 32, "launcher.so", b"the verified bytes")
    assert path.startswith("/proc/self/fd/") and not path.startswith(str(tmp_path))
    (made,) = list(tmp_path.iterdir())
    made.rename(tmp_path / "moved-away")
    planted = tmp_path / made.name
    planted.mkdir()
    (planted / Path(path).name).write_bytes(b"the attacker's bytes")
    assert Path(path).read_bytes() == b"the verified bytes"
    again = private.private_copy("ab" * 32, "launcher.so", b"the verified bytes")
    assert again != path and Path(again).read_bytes() == b"the verified bytes"  # afresh for each load
    for fd in (private._copies.fd, *private._copies.open_memfds):
        os.close(fd)


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
