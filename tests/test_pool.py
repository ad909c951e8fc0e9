"""The compile pool: crashes, hangs and errors stay in their worker; the parent stays whole.

The crash, segfault, timeout and orphan tests run twice: against a process's own `CompilePool`, and
through the compile service (`make_pool` "service": a real server process whose workers are forked
from its worker template), where the client must see the same outcomes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kcache
from kcache.compile.pool.process_pool import CompilePool, Job
from kcache.compile.service.client import ServicePool
from kcache.compile.workers.worker_process import exited_within
from kcache.config import Settings

from . import pool_jobs
from .helpers import spawn


class WaitingServicePool(ServicePool):
    """The compile service's client with CompilePool's `warm` (it waits for the workers), and a check
    at exit that no job fell back to the own pool unless the test expects it."""

    def __init__(self, workers: int, preload: tuple[str, ...], timeout_s: float | None) -> None:
        self.own = CompilePool(workers, timeout_s, preload=preload)
        self.fallback_expected = False
        super().__init__(workers, timeout_s, preload, 60.0, lambda: self.own)

    def warm(self, count: int | None = None, *, wait: bool = True) -> float:
        return super().warm(count, wait=wait)

    def __exit__(self, *exc: object) -> None:
        fell_back = self.own.worker_pids()
        self.close()
        self.own.close()
        assert self.fallback_expected or not fell_back, "the service fell back to the own pool"


@pytest.fixture(params=["pool", "service"])
def make_pool(request: pytest.FixtureRequest) -> object:
    """`make_pool(workers, preload=, timeout_s=)`: a CompilePool, or the compile service's client (in a
    private runtime directory of this test's)."""
    if request.param == "pool":
        return lambda workers, preload=(), timeout_s=None: CompilePool(workers, timeout_s, preload=preload)
    request.getfixturevalue("runtime")
    return lambda workers, preload=(), timeout_s=None: WaitingServicePool(workers, tuple(preload), timeout_s)


def test_bad_jobs_report_their_class_and_the_pool_keeps_serving(make_pool) -> None:
    with make_pool(2, preload=("tests.pool_jobs",)) as pool:
        pool.warm()
        first_pids = set(pool.worker_pids())
        jobs = [
            Job(pool_jobs.double, (1,), tag="good"),
            Job(pool_jobs.abort, ("the compiler's last words",), tag="abort"),
            Job(pool_jobs.segfault, tag="segfault"),
            Job(pool_jobs.hang, timeout_s=1.0, tag="timeout"),
            Job(pool_jobs.raise_value_error, tag="raises"),
            Job(pool_jobs.double, (21,), tag="good too"),
        ]
        outcomes = {r.job.tag: r for r in pool.compile_many(jobs)}

        assert (outcomes["good"].value, outcomes["good too"].value) == (2, 42)
        aborted = outcomes["abort"].error
        assert isinstance(aborted, kcache.CompilerCrashed) and aborted.signal_name == "SIGABRT"
        assert "the compiler's last words" in aborted.stderr_tail and aborted.kernel_name == "abort"
        crashed = outcomes["segfault"].error
        assert isinstance(crashed, kcache.CompilerCrashed) and crashed.signal_name == "SIGSEGV"
        assert "segfault" in crashed.stderr_tail  # faulthandler's traceback names the job's frame
        timed_out = outcomes["timeout"].error
        assert isinstance(timed_out, kcache.CompileTimeout) and timed_out.timeout == 1.0
        assert isinstance(outcomes["raises"].error, ValueError)
        assert "a bad config" in str(outcomes["raises"].error)

        # Three workers died and were replaced; the pool serves on, at full size.
        assert [pool.run(pool_jobs.double, i) for i in range(10)] == [2 * i for i in range(10)]
        pool.warm()  # a replacement may still be starting
        pids = pool.worker_pids()
        assert len(pids) == 2 and set(pids) != first_pids  # dead workers were replaced
        served_by = [pool.run(pool_jobs.worker_pid) for _ in range(6)]
        if isinstance(pool, CompilePool):
            assert set(served_by) <= set(pids)  # a process's own pool keeps its workers
        else:
            assert len(set(served_by)) == 6  # the service: a fresh fork of its template for every job


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_200_jobs_with_crashes_leave_the_parents_memory_and_fds_flat(make_pool) -> None:
    def batch(count: int) -> list[Job]:
        return [Job(pool_jobs.abort) if i % 20 == 19 else Job(pool_jobs.double, (i,)) for i in range(count)]

    with make_pool(2, preload=("tests.pool_jobs",)) as pool:
        list(pool.compile_many(batch(40)))  # warm: threads, worker replacement, allocator
        pool.warm()  # the last crash's replacement is up
        fds, rss = _open_fds(), _rss_bytes()
        results = list(pool.compile_many(batch(200)))
        pool.warm()
        assert sum(isinstance(r.error, kcache.CompilerCrashed) for r in results) == 10
        assert sum(r.ok for r in results) == 190
        # No growth: fewer is no leak (a compile service this process reached earlier may say
        # goodbye when it idles out meanwhile, and its connection closes).
        assert _open_fds() <= fds
        assert _rss_bytes() - rss < 4 << 20


def test_killing_the_parent_leaves_no_orphan_workers() -> None:
    parent = spawn("""
        import json, sys
        from kcache.compile.pool.process_pool import CompilePool
        from tests import pool_jobs
        pool = CompilePool(2, preload=())
        pool.warm()
        pool.submit(pool_jobs.hang)  # one worker busy, one idle
        print(json.dumps(pool.worker_pids()), flush=True)
        sys.stdin.readline()
    """)
    assert parent.stdout is not None
    workers = json.loads(parent.stdout.readline())
    assert len(workers) == 2 and all(not exited_within(pid, 0) for pid in workers)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert all(exited_within(pid, 10.0) for pid in workers)


def test_killing_the_service_leaves_no_orphan_workers(runtime: Path) -> None:
    """The service's side of the test above: its workers (forked from its template) and the template
    die with it, busy or idle."""
    from kcache.compile.service import connection as service_connection

    with WaitingServicePool(2, ("tests.pool_jobs",), None) as pool:
        pool.warm()
        served = service_connection.request(pool.name, ("status",))
        workers, template = served["worker_pids"], served["template_pid"]
        pool.submit(pool_jobs.hang)  # one worker busy, one idle
        assert len(workers) == 2 and template is not None
        assert all(not exited_within(pid, 0) for pid in [*workers, template])
        os.kill(served["pid"], signal.SIGKILL)
        assert all(exited_within(pid, 10.0) for pid in [*workers, template])
        pool.fallback_expected = True  # the lost hang went to the own pool: not what this test is about


def test_a_worker_that_cannot_start_is_a_clear_error_not_a_hang(make_pool) -> None:
    with make_pool(1, preload=("kcache_no_such_module",)) as pool:
        with pytest.raises(kcache.CompilePoolError, match="kcache_no_such_module") as caught:
            pool.run(pool_jobs.double, 1)
        assert "KCACHE_COMPILE_ISOLATION=inprocess" in str(caught.value)
        if isinstance(pool, ServicePool):
            # The error came from the service's pool, whose driver thread lives on: a TypeError once
            # killed it when the forked template died at import, and the job waited minutes.
            from kcache.compile.service import address as service_address

            assert "Exception in thread" not in service_address.log_path(pool.name).read_text()


def test_compile_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KCACHE_COMPILE_WORKERS", "3")
    monkeypatch.setenv("KCACHE_COMPILE_TIMEOUT", "0")
    monkeypatch.setenv("KCACHE_COMPILE_ISOLATION", "InProcess")
    settings = Settings.from_env(tmp_path)
    assert (settings.compile_workers, settings.compile_timeout_s, settings.compile_isolation) == (3, None, "inprocess")
    monkeypatch.setenv("KCACHE_COMPILE_ISOLATION", "thread")
    with pytest.raises(ValueError, match="KCACHE_COMPILE_ISOLATION='thread' must be one of server, pool, inprocess"):
        Settings.from_env(tmp_path)
    monkeypatch.delenv("KCACHE_COMPILE_ISOLATION")
    assert Settings.from_env(tmp_path).compile_isolation == "server"
    monkeypatch.setenv("KCACHE_COMPILE_WORKERS", "0")
    with pytest.raises(ValueError, match="KCACHE_COMPILE_WORKERS"):
        Settings.from_env(tmp_path)


@pytest.mark.tilelang
@pytest.mark.parametrize("fault", ["abort", "hang"])
def test_a_compile_that_crashes_or_hangs_raises_and_the_next_call_works(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, fault: str, make_pool
) -> None:
    pytest.importorskip("tilelang")
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from stress.programs.kernels import CPU_TARGET, elementwise_add

    faulty, good = elementwise_add(n=1024), elementwise_add(n=2048)
    name = str(faulty.attrs["global_symbol"])
    monkeypatch.setenv(f"KCACHE_TEST_{fault.upper()}_KERNEL", name)
    with make_pool(1, timeout_s=10.0, preload=(*TILELANG_PRELOAD, "tests.pool_jobs_faulty")) as pool:
        cache = kcache.KernelCache(cache_root, compile_pool=pool)
        expected = kcache.CompilerCrashed if fault == "abort" else kcache.CompileTimeout
        for _attempt in range(2):  # the second attempt proves the key's lock was released
            with pytest.raises(expected) as caught:
                cache.get_or_compile(faulty, CPU_TARGET, out_idx=[2])
            assert caught.value.kernel_name == name
        if fault == "abort":
            assert caught.value.signal_name == "SIGABRT" and f"injected abort while compiling {name}" in str(caught.value)
        assert cache.store.keys() == [] and os.listdir(cache_root / ".staging") == []
        assert cache.stats()["publish_failures"] == 0  # a compile's failure is not the disk's

        kernel = cache.get_or_compile(good, CPU_TARGET, out_idx=[2])
        assert kernel.adapter.libpath.startswith(str(cache_root))
        assert len(cache.store.keys()) == 1 and cache.stats()["compiles"] == 1


def test_the_compile_memory_budget_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.setting_values import compile_memory_budget

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.delenv("KCACHE_COMPILE_MEMORY", raising=False)
    assert compile_memory_budget() == total // 2  # the default: half the machine's memory
    for value, expected in (("25%", int(total * 0.25)), ("2G", 2 << 30), ("512MiB", 512 << 20), ("0", None)):
        monkeypatch.setenv("KCACHE_COMPILE_MEMORY", value)
        assert compile_memory_budget() == expected
    for bad in ("150%", "lots"):
        monkeypatch.setenv("KCACHE_COMPILE_MEMORY", bad)
        with pytest.raises(ValueError, match=f"KCACHE_COMPILE_MEMORY='{bad}'"):
            compile_memory_budget()


# ---------------------------------------------------------------- faults of the environment (issue 22)


SITE_HOOK = """
import os, sys
print("sitecustomize says hello on stdout", flush=True)
print("and on stderr", file=sys.stderr, flush=True)
os.write(1, b"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x10 a raw frame-like write\\n")
"""


@pytest.mark.tilelang
@pytest.mark.parametrize("mode", ["pool", "server", "inprocess"])
def test_a_site_hook_that_prints_at_start_does_not_break_compiles(
        mode: str, cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: Path) -> None:
    """A sitecustomize.py that writes to stdout and stderr in every interpreter (as conda activations and
    debug hooks do) reaches the workers' logs, never the protocol."""
    pytest.importorskip("tilelang")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITE_HOOK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("KCACHE_COMPILE_ISOLATION", mode)
    code = f"""
import json, kcache
from stress.programs.kernels import CPU_TARGET, elementwise_add
cache = kcache.KernelCache({str(cache_root)!r})
kernel = cache.get_or_compile(elementwise_add(n=1536), CPU_TARGET, out_idx=[2])
print("RESULT", json.dumps({{"compiles": cache.stats()["compiles"], "entries": len(cache.store.keys()),
                            "source": "C" in kernel.get_kernel_source()}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=str(Path(__file__).resolve().parent.parent))
    assert "sitecustomize says hello" in done.stdout  # the hook fired, in the program itself at least
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result == {"compiles": 1, "entries": 1, "source": True}


def test_a_worker_that_never_gets_ready_fails_within_its_deadline() -> None:
    with CompilePool(1, preload=("tests.pool_jobs_hang_at_import",), start_timeout_s=2.0) as pool:
        with pytest.raises(kcache.WorkerStartFailed, match="within 2 s") as caught:
            pool.run(pool_jobs.double, 1)
    assert isinstance(caught.value, kcache.CompilePoolError)


def test_a_program_that_patches_popen_still_gets_its_workers(monkeypatch: pytest.MonkeyPatch, runtime: Path) -> None:
    """TileLang's own tests patch subprocess.Popen to fake a hanging nvcc; kcache's workers and its
    service start through the Popen bound when kcache was imported."""
    from kcache.compile.service.client import ServicePool

    def broken_popen(*args: object, **kwargs: object) -> object:
        raise AttributeError("a test double of Popen without the attributes kcache would use")

    monkeypatch.setattr(subprocess, "Popen", broken_popen)
    with CompilePool(1, preload=("tests.pool_jobs",)) as pool:
        assert pool.run(pool_jobs.double, 21) == 42
    own = CompilePool(1, preload=("tests.pool_jobs",), start_timeout_s=60.0)
    service = ServicePool(1, None, ("tests.pool_jobs",), 60.0, lambda: own)
    assert service.run(pool_jobs.double, 4) == 8 and service.server_pid is not None
    assert not own.worker_pids()  # the service ran it, not the fallback
    service.close()
    own.close()


def test_an_answer_that_cannot_be_rebuilt_fails_its_job_and_the_pool_serves_on(make_pool) -> None:
    with make_pool(1, preload=("tests.pool_jobs",)) as pool:
        with pytest.raises(RuntimeError, match="cannot be rebuilt") as caught:
            pool.run(pool_jobs.raise_unrebuildable, name="odd_exception")
        assert "odd_exception" in str(caught.value)
        assert pool.run(pool_jobs.double, 5) == 10  # same worker, still serving


def test_a_failure_in_the_pools_own_thread_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever breaks inside the thread that drives a worker fails that job's future, never leaves
    the caller waiting; the next job gets a fresh worker."""
    from kcache.compile.workers import worker_process

    with CompilePool(1, preload=("tests.pool_jobs",)) as pool:
        pool.warm()
        original = worker_process.WorkerProcess.run
        calls = []

        def failing_once(self: object, payload: bytes, timeout_s: float | None, calls_of_caller: object) -> tuple:
            calls.append(1)
            if len(calls) == 1:
                raise AttributeError("a bug in the pool's thread")
            return original(self, payload, timeout_s, calls_of_caller)  # type: ignore[arg-type]

        monkeypatch.setattr(worker_process.WorkerProcess, "run", failing_once)
        with pytest.raises(kcache.CompilePoolError, match="a bug in the pool's thread"):
            pool.submit(pool_jobs.double, 1).result(timeout=60)
        assert pool.submit(pool_jobs.double, 2).result(timeout=120) == 4


def test_aborting_a_job_that_just_finished_never_kills_the_next_job_on_its_worker() -> None:
    """The service aborts a gone client's running job (`CompilePool.abort`). A job that finished at
    that moment shares its worker with the next job; the abort must not kill that one. The abort is
    made from the finished future's callback: its pool thread has set the result and not yet taken
    the next job, the window a disconnect hit in a stress run (CompilerCrashed by SIGKILL)."""
    with CompilePool(1, preload=()) as pool:
        pool.warm()
        worker = pool.worker_pids()[0]
        first = pool.submit(pool_jobs.double, 1)
        aborts: list[bool] = []
        first.add_done_callback(lambda finished: aborts.append(pool.abort(finished, "its client went away")))
        second = pool.submit(pool_jobs.double, 2)
        assert first.result(timeout=60) == 2
        assert second.result(timeout=60) == 4
        # The abort found the job still on its worker and killed it: the fault fired, and the
        # second job ran on a replacement.
        assert aborts == [True]
        assert worker not in pool.worker_pids()
