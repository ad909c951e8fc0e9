"""A compile in a fork of the calling process while the compile service is not warm (`caller_fork`).

The service here preloads tests/pool_jobs_gated_import.py, whose import waits for the test: the
service stays not warm (no worker ready) exactly as long as the test wants, with no timing involved.
The test process has `tests` imported, so the fork's condition on the preload holds."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcache.compile.caller_calls import CallerCalls
from kcache.compile.compile_slots import CompileSlots
from kcache.compile.fork import caller_fork
from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.service import client
from kcache.compile.service import connection as service_connection
from kcache.errors import CompilerCrashed, CompileTimeout

from . import background, pool_jobs
from .helpers import PROJECT, child_env
from .pool_jobs_gated_import import IMPORT_GATE_ENV

GATED = ("tests.pool_jobs_gated_import", "tests.pool_jobs")


@pytest.fixture
def gate(runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The FIFO the service's import waits on; the fork allowed (the runtime fixture turns it off)."""
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()
              and t.name not in caller_fork.KCACHE_THREADS]
    assert not others, f"threads left by an earlier test keep this process from forking: {others}"
    fifo = tmp_path / "import-gate"
    os.mkfifo(fifo)
    monkeypatch.setenv(IMPORT_GATE_ENV, str(fifo))
    monkeypatch.setenv("KCACHE_CALLER_FORK", "1")
    yield fifo
    open_gate(fifo)  # a service still importing may finish and be stopped


def open_gate(fifo: Path) -> None:
    """Let the service's import finish (a no-op when nobody waits on it any more)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader waits
        return
    os.close(fd)


def gated_pool(workers: int = 2) -> client.ServicePool:
    own = CompilePool(workers, None, preload=())
    return client.ServicePool(workers, 30.0, GATED, 60.0, lambda: own)


def test_the_service_starts_once_the_forks_job_is_done(gate: Path) -> None:
    """Started beside the fork, the service's own start (its interpreter and template importing
    TileLang) slowed the fork's nvcc by up to 30% on an H100: it starts once the job is done. The
    job asks this process, while it runs, whether a start is under way."""
    pool = gated_pool()
    seen: dict[str, bool] = {}

    def while_the_fork_compiles() -> bool:  # called back here by the job in the fork
        seen["starting"] = any(t.name == caller_fork.SERVICE_START_THREAD for t in threading.enumerate())
        seen["connected"] = pool._conn is not None
        return True

    try:
        calls = CallerCalls({"during": while_the_fork_compiles})
        assert pool.run(pool_jobs.call_back, "during", calls=calls) is True
        assert pool.caller_forks == 1 and seen == {"starting": False, "connected": False}
        assert pool.ping()  # and once the job was done, the service was started
    finally:
        pool.close()


def children_left() -> bool:
    """Whether this process has a child, live or not yet reaped, besides the suite's background drivers
    (tests/background.py). Read from /proc, not by waiting on any child, which would reap a driver."""
    me, drivers = os.getpid(), background.driver_pids()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in drivers:
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if parent == me:
            return True
    return False


def test_until_the_service_is_warm_a_job_runs_in_a_fork_of_the_caller_and_then_in_the_service(gate: Path) -> None:
    pool = gated_pool()
    try:
        assert pool.run(pool_jobs.parent_pid) == os.getpid()  # its parent: this process, not a template
        assert pool.caller_forks == 1
        assert pool.ping()  # the service, started once the fork was done, listens (and still imports)
        served = service_connection.request(pool.name, ("status",))
        assert served["warm"] is False and served["jobs"] == 0
        assert not children_left()  # the fork was reaped before the job's value came back

        # A crash, a hang and a failure in the fork are the caller's errors, as a worker's are.
        with pytest.raises(CompilerCrashed) as crashed:
            pool.run(pool_jobs.abort, "the fork says goodbye", name="crashing kernel")
        assert crashed.value.signal_name == "SIGABRT" and "the fork says goodbye" in crashed.value.stderr_tail
        with pytest.raises(CompileTimeout):
            pool.run(pool_jobs.hang, timeout_s=0.5)
        with pytest.raises(ValueError, match="a bad config"):
            pool.run(pool_jobs.raise_value_error)
        assert pool.caller_forks == 4 and not children_left()  # the hung fork was killed and reaped

        open_gate(gate)
        pool.warm(1, wait=True)  # the service's worker is ready ...
        assert pool.ping()  # ... and its "warmed", sent before the ping's answer, was read
        assert pool.run(pool_jobs.parent_pid) != os.getpid()  # now the service's worker runs it
        assert pool.caller_forks == 4 and service_connection.request(pool.name, ("status",))["jobs"] == 1
    finally:
        pool.close()


def test_a_caches_warm_up_waiting_on_the_service_leaves_the_first_compile_to_a_fork(gate: Path, tmp_path: Path) -> None:
    """A cache opened before `import tilelang` warms the service up in a thread that waits for the
    service's template (here held at its import by the gate) and then for its job identifying the
    toolchain. That thread must not keep the first compile out of a fork: the compile would wait for
    the template's import (on the CPU machine, 0.36 s of a 2.1 s call)."""
    from kcache.cache.service_warmup import warm_service

    pool = gated_pool()
    (tmp_path / "root").mkdir()
    warming = threading.Thread(target=warm_service, args=(pool, 1, str(tmp_path / "root")),
                               name=caller_fork.SERVICE_WARM_THREAD, daemon=True)
    warming.start()
    try:
        assert warming.is_alive()  # its job cannot run while the template's import waits on the gate
        assert caller_fork.unsafe_reason(GATED) is None
        assert pool.run(pool_jobs.parent_pid) == os.getpid()  # the fork ran it: its parent is this process
        assert pool.caller_forks == 1 and warming.is_alive()
    finally:
        pool.close()  # the warm-up's job is aborted: its thread ends
    warming.join(30)
    assert not warming.is_alive()


def test_no_fork_while_another_thread_runs_or_when_turned_off(gate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock another thread holds at a fork stays locked in the child forever: with a thread beside
    the caller, the job waits for the service instead."""
    assert caller_fork.unsafe_reason(GATED) is None

    def open_gate_once_the_service_imports() -> None:
        with open(gate, "w"):  # blocks until the service's import opens the gate to read it
            pass
        done.wait()

    done = threading.Event()
    other = threading.Thread(target=open_gate_once_the_service_imports, name="the program's thread")
    other.start()
    pool = gated_pool()
    try:
        assert caller_fork.unsafe_reason(GATED) == "the thread \"the program's thread\" runs beside the caller"
        assert pool.run(pool_jobs.parent_pid) != os.getpid()  # the service's worker ran it, once warm
        assert pool.caller_forks == 0
    finally:
        done.set()
        reader = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)  # the thread's open returns, if it waits still
        other.join()
        os.close(reader)
        pool.close()
    assert caller_fork.unsafe_reason(("a_module_nobody_imported",)) == "a_module_nobody_imported is not imported in this process"
    assert caller_fork.unsafe_reason(()) is not None
    monkeypatch.setenv("KCACHE_CALLER_FORK", "0")
    assert gated_pool().caller_fork is False


def test_kcache_draws_nothing_from_the_programs_random_state(runtime: Path) -> None:
    """A slot's first try and a wait's pause are random, but not from `random`'s module state, which
    is the program's: Helion's searches seed it, and draw their configs between compiles."""
    import random

    from kcache.tiers.backoff import Backoff

    saved = random.getstate()  # this process's, given back: the seed below is this test's
    try:
        random.seed(1000)
        state = random.getstate()
        slots = CompileSlots("draws", 4)
        taken = [slots.try_take() for _ in range(3)]
        pauses = [Backoff(10.0).next_pause() for _ in range(3)]
        assert all(taken) and all(0.0 < pause <= 1.0 for pause in pauses)
        assert random.getstate() == state
        for slot in taken:
            slot.release()  # type: ignore[union-attr]
    finally:
        random.setstate(saved)


def test_forks_and_the_services_workers_share_one_bound_of_compile_slots(gate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot: while a client's fork holds it, the service's job waits; freed, the job runs. A job
    the service runs holds a slot, so no fork can take it meanwhile."""
    monkeypatch.delenv(IMPORT_GATE_ENV)  # the service's import does not wait here
    pool = gated_pool(workers=1)
    slots = CompileSlots(pool.name, 1)
    try:
        held = slots.try_take()  # as a fork of another client holds it
        assert held is not None and slots.try_take() is None
        future = pool.submit(pool_jobs.double, 21)
        assert pool.ping()  # the service took the job in, and found no slot for it
        served = service_connection.request(pool.name, ("status",))
        assert served["waited_for_slot"] >= 1 and served["running"] == 0 and not future.done()
        held.release()
        assert future.result(60) == 42
        assert slots.held() == 0  # the service gave its slot back with the job's end

        fifo, runs = Path(str(gate) + "-job"), Path(str(gate) + "-runs")
        os.mkfifo(fifo)
        running = pool.submit(pool_jobs.gated_run, str(fifo), str(runs))
        with open(fifo, "w") as release:  # opens once the job is running: it holds the slot now
            assert slots.try_take() is None
            release.write("go")
        assert running.result(60) > 0 and slots.held() == 0
    finally:
        pool.close()


PROGRAM = """
import json, os, sys, tempfile
import tilelang
from stress.programs.kernels import CPU_TARGET, pool as kernels
import kcache
from kcache.compile.service import address as service_address, shared_pools as service_pools
from kcache.compile.service import connection as service_connection
spec = kernels(1)[0]
func = spec.build()
cache = kcache.KernelCache(sys.argv[1])
kernel = cache.get_or_compile(func, CPU_TARGET, out_idx=spec.out_idx)
(entry,) = [p for p in cache.root.glob("kernels/*") if p.is_dir()]
plain = tilelang.compile(func, target=CPU_TARGET, out_idx=spec.out_idx)
pools = list(service_pools._shared.values())
print(json.dumps({"forks": sum(p.caller_forks for p in pools), "compiles": cache.stats()["compiles"],
                  "same_source": (entry / "device.cu").read_text() == plain.get_kernel_source(),
                  "service": service_connection.request(pools[0].name, ("status",))["jobs"]}))
"""


@pytest.mark.tilelang
def test_a_program_that_imported_tilelang_first_compiles_its_first_kernel_in_a_fork_as_tilelang_does(
        runtime: Path, tmp_path: Path) -> None:
    """The herd case of the compile service's goal 3, one process: TileLang imported before the cache,
    no service running. The kernel comes from a fork of the program, and is TileLang's own."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path / "root")],
                          capture_output=True, text=True, timeout=600, cwd=str(PROJECT),
                          env=child_env(KCACHE_CALLER_FORK="1", KCACHE_COMPILE_ISOLATION="server"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"forks": 1, "compiles": 1, "same_source": True, "service": 0}


def test_a_process_with_descriptors_numbered_over_1024_compiles_in_a_fork(gate: Path) -> None:
    """select() cannot watch a descriptor numbered 1024 or more; the H100's stress workers (CUDA,
    torch, connections) had such descriptors, and reaping a fork raised ValueError there."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else max(hard, 4096)
    try:  # raising the hard limit needs root (CAP_SYS_RESOURCE), as the suite runs
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), wanted if hard != resource.RLIM_INFINITY else hard))
    except (ValueError, PermissionError) as err:
        pytest.fail(f"this test needs 4096 descriptors (RLIMIT_NOFILE is {soft}/{hard}): {err}")
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    pool = gated_pool()
    try:
        assert max(filler) >= 1024
        assert pool.run(pool_jobs.parent_pid) == os.getpid() and pool.caller_forks == 1
        with pytest.raises(CompileTimeout):  # the hung fork is killed and reaped through a pidfd over 1024
            pool.run(pool_jobs.hang, timeout_s=0.5)
        assert not children_left()
    finally:
        pool.close()
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


ORPHAN_CLIENT = """
import sys
sys.path.insert(0, {project!r})
from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.service import client
from kcache.compile.service import connection as service_connection
from tests import pool_jobs
pool = client.ServicePool(2, None, {preload!r}, 60.0, lambda: CompilePool(1, None, preload=()))
pool.run(pool_jobs.tell_pid_and_hang, {fifo!r})
"""


def test_a_client_killed_while_its_fork_compiles_takes_the_fork_with_it(gate: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fork-pid"
    os.mkfifo(fifo)
    code = ORPHAN_CLIENT.format(project=str(PROJECT), preload=GATED, fifo=str(fifo))
    program = subprocess.Popen([sys.executable, "-c", code], env=child_env(), cwd=str(PROJECT))
    try:
        with open(fifo) as told:  # the job runs, in a fork of the program
            fork = int(told.read())
        with open(f"/proc/{fork}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) == program.pid  # its parent: the program
        pidfd = os.pidfd_open(fork)
        program.kill()
        program.wait(30)
        try:
            assert wait_for_exit(pidfd, 30), f"the fork {fork} outlived its killed program"
        finally:
            os.close(pidfd)
    finally:
        program.kill()
        program.wait(30)


def wait_for_exit(pidfd: int, timeout_s: float) -> bool:
    from kcache.compile.protocol import readable_within

    return readable_within(pidfd, timeout_s)


def test_a_cache_opened_after_the_fork_setting_or_runtime_directory_changed_gets_a_pool_of_the_new_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ServicePool reads KCACHE_CALLER_FORK and XDG_RUNTIME_DIR when it is made. The process's shared
    pool made under other values must not serve a cache opened under these: with the fork turned off
    since, a job would still run in a fork of the caller (in the suite, a test's own service was
    bypassed that way, and its fault never fired)."""
    from kcache.compile.service import shared_pools

    saved = dict(shared_pools._shared)
    monkeypatch.delenv("KCACHE_CALLER_FORK", raising=False)
    try:
        forking = shared_pools.shared_service_pool(2, 30.0, (), 60.0)
        assert forking.caller_fork and shared_pools.shared_service_pool(2, 30.0, (), 60.0) is forking
        monkeypatch.setenv("KCACHE_CALLER_FORK", "0")
        not_forking = shared_pools.shared_service_pool(2, 30.0, (), 60.0)
        assert not_forking is not forking and not not_forking.caller_fork
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        elsewhere = shared_pools.shared_service_pool(2, 30.0, (), 60.0)
        assert elsewhere is not not_forking and shared_pools.shared_service_pool(2, 30.0, (), 60.0) is elsewhere
    finally:
        for made in set(shared_pools._shared.values()) - set(saved.values()):
            made.close()
        shared_pools._shared.clear()
        shared_pools._shared.update(saved)
