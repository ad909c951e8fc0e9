"""The compile service (KCACHE_COMPILE_ISOLATION=server): real server processes, real clients, real
users. Jobs are tests/pool_jobs.py's; the services here preload nothing heavy, and each test has its
own private runtime directory (XDG_RUNTIME_DIR), so its services are its own."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.service import address, client
from kcache.compile.service import connection as service_connection
from kcache.compile.workers.worker_process import exited_within
from kcache.errors import CompilerCrashed, CompileTimeout
from kcache.store import layout
from stress.service_runtime import service_processes

from . import pool_jobs
from .faults import needs_root
from .helpers import child_env
from .unprivileged import UnprivilegedEnv

PROJECT = Path(__file__).resolve().parent.parent
PRELOAD = ("tests.pool_jobs",)


# The fallback pools service_pool made for this test: closed when it ends. A job that a service
# briefly unavailable sent to one started its worker thread, which later tests then found running
# (tests/test_caller_fork.py refuses to fork beside a thread of an earlier test).
_fallbacks: list[CompilePool] = []


@pytest.fixture(autouse=True)
def _close_fallback_pools() -> Iterator[None]:
    yield
    while _fallbacks:
        _fallbacks.pop().close()


def service_pool(idle_s: float = 60.0, workers: int = 2, fallback: CompilePool | None = None) -> client.ServicePool:
    own = fallback
    if own is None:
        own = CompilePool(workers, None, preload=PRELOAD)
        _fallbacks.append(own)
    return client.ServicePool(workers, None, PRELOAD, idle_s, lambda: own)


def status(pool: client.ServicePool) -> dict:
    return service_connection.request(pool.name, ("status",))


CLIENT = """
import json, sys
sys.path.insert(0, {project!r})
from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.service import client
from kcache.compile.service import connection as service_connection
from tests import pool_jobs
pool = client.ServicePool(2, None, ("tests.pool_jobs",), 60.0, lambda: CompilePool(1, None, preload=()))
print(json.dumps({{"worker": pool.run(pool_jobs.worker_pid), "server": pool.server_pid}}))
"""


def test_processes_share_one_service_and_its_warm_workers(runtime: Path) -> None:
    code = CLIENT.format(project=str(PROJECT))
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0]["server"] == runs[1]["server"]  # the second process found the first one's service
    pool = service_pool()
    assert pool.run(pool_jobs.double, 21) == 42 and pool.server_pid == runs[0]["server"]
    served = status(pool)
    assert served["jobs"] == 3 and served["refused"] == 0
    assert {runs[0]["worker"], runs[1]["worker"]} <= set(range(1, 1 << 22))  # real pids of the service's workers
    assert (runtime / "kcache").stat().st_mode & 0o777 == 0o700


RACING_CLIENT = """
import json, os, sys
sys.path.insert(0, {project!r})
from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.service import client
from kcache.compile.service import connection as service_connection
from tests import pool_jobs
real_start = service_connection.start

def start(*args):
    with open({starts!r}, "a") as starts:
        starts.write(f"{{os.getpid()}}\\n")
    return real_start(*args)

service_connection.start = start
pool = client.ServicePool(2, None, ("tests.pool_jobs",), 60.0, lambda: CompilePool(1, None, preload=()))
print("ready", flush=True)
sys.stdin.readline()  # the barrier: every client finds no service at the same moment
print(json.dumps({{"worker": pool.run(pool_jobs.worker_pid), "server": pool.server_pid}}))
"""


def test_clients_that_find_no_service_at_once_start_one_server(runtime: Path, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    code = RACING_CLIENT.format(project=str(PROJECT), starts=str(starts))
    clients = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for _ in range(6)]
    for proc in clients:
        assert proc.stdout.readline().strip() == "ready"
    for proc in clients:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    runs = [json.loads(proc.communicate(timeout=120)[0]) for proc in clients]
    assert len({run["server"] for run in runs}) == 1 and runs[0]["server"] is not None
    assert len(starts.read_text().split()) == 1  # one of them started it; the others waited for its socket


def test_crashes_and_hangs_kill_a_worker_of_the_service_not_the_service(runtime: Path) -> None:
    pool = service_pool()
    with pytest.raises(CompilerCrashed) as crashed:
        pool.run(pool_jobs.segfault, name="segv_kernel")
    assert "segv_kernel" in str(crashed.value) and "SIGSEGV" in str(crashed.value)
    with pytest.raises(CompileTimeout):
        pool.run(pool_jobs.hang, name="hung_kernel", timeout_s=1.0)
    server = pool.server_pid
    assert pool.run(pool_jobs.double, 2) == 4 and pool.server_pid == server
    assert status(pool)["failed"] == 2


def test_a_client_killed_mid_job_leaves_the_service_serving(runtime: Path) -> None:
    code = CLIENT.format(project=str(PROJECT)).replace("pool.run(pool_jobs.worker_pid)",
                                                       "(print('submitted', flush=True), pool.run(pool_jobs.hang))")
    victim = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert victim.stdout is not None and victim.stdout.readline().strip() == "submitted"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    pool = service_pool()
    assert pool.run(pool_jobs.double, 5) == 10  # the service lives on; its other worker serves
    assert status(pool)["pid"] == pool.server_pid


def test_the_service_killed_mid_job_falls_back_to_the_own_pool(runtime: Path, tmp_path: Path, caplog) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    own = CompilePool(1, None, preload=PRELOAD)
    pool = service_pool(fallback=own)
    assert pool.run(pool_jobs.double, 1) == 2
    server = pool.server_pid
    assert server is not None
    with caplog.at_level(logging.WARNING, logger="kcache"):
        future = pool.submit(pool_jobs.read_fifo, str(fifo))
        os.kill(server, signal.SIGKILL)
        # The service's template and workers gone too (none is forked once the server is dead): a
        # service worker still waiting in the FIFO's open would take the release meant for the own
        # pool's worker (CI saw it), which would then wait for ever.
        assert all(exited_within(pid, 30) for pid in [server, *service_processes(runtime)])
        released = threading.Thread(target=lambda: fifo.write_text("done"))
        released.start()  # the job runs again in the own pool, whose worker opens the FIFO
        assert future.result(timeout=60) == "done"
        released.join(30)
    assert any("went away" in r.getMessage() for r in caplog.records)
    own.close()


def test_a_stale_socket_file_of_a_dead_server_is_replaced(runtime: Path) -> None:
    pool = service_pool()
    path = address.socket_path(pool.name)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # bound, never listening, then closed: what a SIGKILLed server leaves
    stale.close()
    assert path.exists()
    assert pool.run(pool_jobs.double, 3) == 6
    assert status(pool)["pid"] == pool.server_pid


def service_files(name: str) -> list[str]:
    """The files of the service `name` in its private runtime directory."""
    return sorted(entry for entry in os.listdir(address.lock_path(name).parent)
                  if entry.startswith((f"compile-{name}.", "compile-slot-")))


def test_the_service_exits_when_idle(runtime: Path) -> None:
    pool = service_pool(idle_s=1.0)
    assert pool.run(pool_jobs.double, 4) == 8
    server = pool.server_pid
    assert server is not None and exited_within(server, 30)
    assert not address.socket_path(pool.name).exists()
    assert service_files(pool.name) == [f"compile-{pool.name}.log"]  # its lock, slots and start lock went with it
    assert pool.run(pool_jobs.double, 4) == 8  # the next job starts a new one
    assert pool.server_pid != server


def test_a_stopped_service_removes_its_lock_and_slot_files_and_keeps_its_log(runtime: Path) -> None:
    pool = service_pool(idle_s=60.0)
    assert pool.run(pool_jobs.double, 4) == 8
    server, name = pool.server_pid, pool.name
    running = service_files(name)
    assert {f"compile-{name}.lock", f"compile-{name}.sock", f"compile-{name}.start.lock"} <= set(running), running
    assert any(entry.startswith("compile-slot-") for entry in running), running  # the job ran in a slot
    assert service_connection.request(name, ("stop",)) == server and server is not None and exited_within(server, 30)
    assert service_files(name) == [f"compile-{name}.log"]
    assert pool.run(pool_jobs.double, 1) == 2 and pool.server_pid != server  # a new service starts as before


def test_another_environment_gets_another_service(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = service_pool()
    assert first.run(pool_jobs.double, 1) == 2
    monkeypatch.setenv("TL_TEMPLATE_PATH", "/elsewhere/templates")  # an import-time setting of TileLang
    second = service_pool()
    assert second.name != first.name
    assert second.run(pool_jobs.double, 1) == 2 and second.server_pid != first.server_pid


def test_a_job_writes_with_its_clients_umask_not_the_services(runtime: Path, tmp_path: Path) -> None:
    """A pool's worker inherits its process's umask; a service's workers are forks of one template
    (whose umask is the service's) serving many processes, so each job carries its client's. Two
    jobs, two fresh forks, two umasks, two modes."""
    pool = service_pool(workers=1)
    previous = os.umask(0o077)
    try:
        private, first = pool.run(pool_jobs.new_file_mode, str(tmp_path / "private"))
        os.umask(0o002)
        shared, second = pool.run(pool_jobs.new_file_mode, str(tmp_path / "shared"))
    finally:
        os.umask(previous)
    assert first != second  # a fresh fork for each job
    assert (private, shared) == (0o600, 0o664)


def interpreter_spellings(made: Path) -> tuple[Path, str]:
    """A bin folder where `python` and `python3.X` are this interpreter, and the versioned name. In a
    venv, the venv's own (a link to its python from another folder would not be the venv: Python
    finds pyvenv.cfg beside the path it was started by); elsewhere, links in `made`, as a venv has."""
    versioned = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if sys.prefix != sys.base_prefix:
        bin_dir = Path(sys.executable).parent
        assert (bin_dir / versioned).exists() and (bin_dir / "python").exists(), sorted(os.listdir(bin_dir))
        return bin_dir, versioned
    made.mkdir()
    (made / versioned).symlink_to(sys.executable)
    (made / "python").symlink_to(versioned)
    return made, versioned


def test_one_environment_names_one_service_whatever_its_spelling(tmp_path: Path) -> None:
    """`python`, `python3.X`, the `kcache` console script (whose shebang names `python3.X`) and a
    PATH that finds the same compilers name one service (`kcache server status` shows its socket);
    a PATH that finds another nvcc names another (the compile would differ)."""
    other_nvcc, extra = tmp_path / "other-cuda", tmp_path / "extra"
    for directory in (other_nvcc, extra):
        directory.mkdir()
    bin_dir, versioned = interpreter_spellings(tmp_path / "venv-bin")
    script = tmp_path / "kcache"  # what pip writes for the console script
    script.write_text(f"#!{bin_dir / versioned}\nimport sys\nfrom kcache.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    (other_nvcc / "nvcc").write_text("#!/bin/sh\nexit 1\n")
    (other_nvcc / "nvcc").chmod(0o755)
    path = os.environ["PATH"]

    def socket_of(command: list[str], search: str = path) -> str:
        done = subprocess.run([*command, "server", "status", "--json"], capture_output=True, text=True, timeout=120,
                              env=child_env(PATH=search), cwd=str(PROJECT))
        assert done.returncode in (0, 1), done.stderr[-2000:]
        return json.loads(done.stdout)["socket"]

    plain = socket_of([sys.executable, "-m", "kcache"])
    assert socket_of([str(bin_dir / "python"), "-m", "kcache"]) == plain
    assert socket_of([str(script)]) == plain
    assert socket_of([sys.executable, "-m", "kcache"], f"{extra}{os.pathsep}{bin_dir}{os.pathsep}{path}") == plain
    assert socket_of([sys.executable, "-m", "kcache"], f"{other_nvcc}{os.pathsep}{path}") != plain


def test_importing_tilelang_before_or_after_the_cache_opens_names_one_service() -> None:
    """`import tilelang` sets its path variables to its own defaults: the same environment as unset.
    A value of the caller's own still names another service."""
    code = textwrap.dedent("""
        import os, sys
        os.environ.pop("TL_TEMPLATE_PATH", None); os.environ.pop("TL_CUTLASS_PATH", None); os.environ.pop("TVM_LIBRARY_PATH", None)
        from kcache.compile.service.address import identity
        before = identity(("tilelang",), 2)
        import tilelang
        assert os.environ.get("TL_TEMPLATE_PATH"), "TileLang no longer sets TL_TEMPLATE_PATH at import"
        after = identity(("tilelang",), 2)
        os.environ["TL_TEMPLATE_PATH"] = "/elsewhere/templates"
        print(before, after, identity(("tilelang",), 2))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=child_env(), cwd=str(PROJECT))
    assert done.returncode == 0, done.stderr[-3000:]
    before, after, elsewhere = done.stdout.split()
    assert before == after != elsewhere


def test_a_client_s_hash_seed_is_its_worker_s(runtime: Path) -> None:
    """TileLang's output depends on the interpreter's hash seed (its lowering iterates over hashed
    sets: tests/test_corpus.py saw a LayerNorm compile two ways under two seeds). A client that
    fixes PYTHONHASHSEED gets a service, and workers, of that seed; one that does not shares one
    with the others that do not."""
    code = CLIENT.format(project=str(PROJECT)).replace("pool.run(pool_jobs.worker_pid)",
                                                       'pool.run(pool_jobs.string_hash, "kcache"), "own": hash("kcache")')
    assert "string_hash" in code
    runs = {}
    for seed in ("1", "2", "1", None, None):
        env = {name: value for name, value in os.environ.items() if name != "PYTHONHASHSEED"}
        if seed is not None:
            env["PYTHONHASHSEED"] = seed
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.setdefault(seed, []).append(json.loads(done.stdout))
    for seed in ("1", "2"):
        assert all(run["worker"] == run["own"] for run in runs[seed]), (seed, runs[seed])
    assert runs["1"][0]["server"] == runs["1"][1]["server"] != runs["2"][0]["server"]
    assert runs[None][0]["server"] == runs[None][1]["server"] not in (runs["1"][0]["server"], runs["2"][0]["server"])


@needs_root
def test_another_user_can_neither_reach_nor_use_the_service(runtime: Path, unprivileged_env: UnprivilegedEnv) -> None:  # noqa: F811
    """kcache-a's service: kcache-b cannot even connect (a 0700 directory), and root, whom permissions do
    not stop, is refused by the server's SO_PEERCRED check."""
    env = unprivileged_env
    a_runtime = env.homes["kcache-a"] / "runtime"
    started = env.run("kcache-a", textwrap.dedent(f"""
        import os, json
        os.makedirs({str(a_runtime)!r}, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = {str(a_runtime)!r}
        from kcache.compile.service import client
        from kcache.compile.service import connection as service_connection
        from kcache.compile.pool.process_pool import CompilePool
        pool = client.ServicePool(1, None, (), 60.0, lambda: CompilePool(1, None, preload=()))
        print(json.dumps({{"value": pool.run(abs, -3), "name": pool.name, "pid": pool.server_pid}}))
    """))
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    try:
        check_refusals(env, a_runtime, info)
    finally:
        os.kill(info["pid"], signal.SIGKILL)


def check_refusals(env: UnprivilegedEnv, a_runtime: Path, info: dict) -> None:  # noqa: F811
    assert info["value"] == 3
    path = a_runtime / "kcache" / f"compile-{info['name']}.sock"
    probe = env.run("kcache-b", textwrap.dedent(f"""
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect({str(path)!r})
            print("connected")
        except PermissionError:
            print("refused")
    """))
    assert probe.stdout.strip() == "refused", probe.stderr
    intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    intruder.connect(str(path))  # root passes the directory's mode
    from kcache.compile import protocol as wire

    # Closed without a word: at once (the hello meets a closed socket), or after it (a reset: unread).
    with pytest.raises((EOFError, ConnectionResetError, BrokenPipeError)):
        wire.send(intruder.fileno(), ("hello", info["name"]))
        wire.recv_bytes(intruder.fileno())
    intruder.close()


def test_service_directories_all_open_to_others_mean_no_service_and_the_own_pool(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """Each place the service may live (kcache.compile.runtime_dir) prepared open to others, as
    another user could have: no service, and the compile in the process's own pool.
    (tests/test_security_local.py: one squatted place moves the service to the next.)"""
    tmp, cache_home = tmp_path / "tmp", tmp_path / "cache"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    prepared = [runtime / "kcache", tmp / f"kcache-{os.geteuid()}", cache_home / "kcache-run" / socket.gethostname()]
    for directory in prepared:
        directory.mkdir(parents=True)
        directory.chmod(0o755)
    own = CompilePool(1, None, preload=PRELOAD)
    pool = service_pool(fallback=own)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        assert pool.run(pool_jobs.double, 6) == 12  # compiled all the same
    assert pool.server_pid is None and own.worker_pids()  # in the own pool: no service was started
    assert any("is open to others (mode 0755)" in r.getMessage() and "set XDG_RUNTIME_DIR" in r.getMessage()
               for r in caplog.records)
    assert not any(list(directory.iterdir()) for directory in prepared)
    own.close()


def test_the_warm_up_names_the_service_the_tilelang_backend_uses() -> None:
    """KernelCache's warm-up names the service by the pool's TILELANG_PRELOAD without importing the
    backend: it must be the backend's own preload, or the warm-up would start a service nobody uses."""
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.tilelang.backend import COMPILE_PRELOAD

    assert TILELANG_PRELOAD == COMPILE_PRELOAD


@pytest.mark.parametrize("case", ["cache-first", "tilelang-first", "guard-error", "install", "KCACHE_TILELANG"])
def test_a_cache_opened_in_server_mode_starts_the_service_in_the_background(runtime: Path, tmp_path: Path,
                                                                           case: str) -> None:
    """Opened before `import tilelang`, a cache warms the service up in the background (its start
    overlaps the import) and has a worker of it identify the toolchain into the root's memo, which
    the first lookup would otherwise hash itself; opened after it, nothing starts until a miss: a
    process that only hits starts no service. Nor does one that declares it compiles nothing
    (KCACHE_JIT_GUARD=error). The drop-in, `kcache.install()` or KCACHE_TILELANG=1, opens the default
    cache before TileLang's import (the service job that identifies the toolchain shows it)."""
    root = str(tmp_path / "root")
    opening = {
        "cache-first": f"import kcache\nkcache.KernelCache({root!r})",  # returns at once; the warm-up has a thread
        "tilelang-first": f"import tilelang\nimport kcache\nkcache.KernelCache({root!r})",
        "guard-error": f"import kcache\nkcache.KernelCache({root!r})",
        "install": "import kcache\nkcache.install()",  # which imports TileLang itself
        "KCACHE_TILELANG": "import kcache\nimport tilelang",  # the hook installs during this import
    }[case]
    code = "\n".join(["import threading", opening,
                      "warming = [t for t in threading.enumerate() if t.name == 'kcache-service-warm']",
                      "for thread in warming:", "    thread.join(60)", "print(len(warming))"])
    extra = {"guard-error": {"KCACHE_JIT_GUARD": "error"}, "KCACHE_TILELANG": {"KCACHE_TILELANG": "1"}}.get(case, {})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=child_env(KCACHE_COMPILE_ISOLATION="server", KCACHE_DIR=root, **extra),
                          cwd=str(PROJECT))
    assert done.returncode == 0, done.stderr[-3000:]
    sockets = list((runtime / "kcache").glob("*.sock")) if (runtime / "kcache").exists() else []
    if case in ("guard-error", "tilelang-first"):
        assert done.stdout.split()[-1] == "0" and not sockets
        return
    # The drop-in's warm-up may be over already: install() imports TileLang after the open.
    assert done.stdout.split()[-1] in (("0", "1") if case in ("install", "KCACHE_TILELANG") else ("1",))
    assert len(sockets) == 1
    served = service_connection.request(sockets[0].name.removeprefix("compile-").removesuffix(".sock"), ("status",))
    assert served["failed"] == 0
    assert served["jobs"] == 1  # the toolchain's identification; no compile
    # Its template forks (the service's own `import tilelang` installed no drop-in under KCACHE_TILELANG=1).
    assert served["template_pid"] is not None
    assert len(list((tmp_path / "root" / layout.TOOLCHAIN).glob("*.json"))) == 1


def test_the_services_workers_are_forked_from_its_template_and_a_crashed_one_too(runtime: Path) -> None:
    pool = service_pool()
    pool.warm(2, wait=True)
    template = status(pool)["template_pid"]
    assert template is not None
    assert {pool.run(pool_jobs.parent_pid) for _ in range(4)} == {template}
    with pytest.raises(CompilerCrashed):
        pool.run(pool_jobs.segfault)
    pool.warm(2, wait=True)  # the replacement is up
    assert pool.run(pool_jobs.parent_pid) == template and status(pool)["template_pid"] == template


def test_the_service_forks_itself_into_its_template_which_keeps_none_of_its_descriptors(runtime: Path) -> None:
    """The server forks its template at its start (no interpreter to start before the TileLang import
    the first compile waits for); the fork must not keep the server's lock, listener or starter pipe."""
    pool = service_pool()
    pool.warm(1, wait=True)
    template = status(pool)["template_pid"]
    fields = Path(f"/proc/{template}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(fields[1]) == pool.server_pid
    command = Path(f"/proc/{template}/cmdline").read_bytes()
    assert command == Path(f"/proc/{pool.server_pid}/cmdline").read_bytes()  # forked, not an exec'd interpreter
    descriptors = {int(fd): os.readlink(f"/proc/{template}/fd/{fd}") for fd in os.listdir(f"/proc/{template}/fd")}
    assert sorted(descriptors)[:3] == [0, 1, 2] and descriptors[0] == os.devnull
    extra = [target for fd, target in descriptors.items() if fd > 2]
    assert len(extra) == 1 and extra[0].startswith("socket:"), descriptors  # its control socket only
    # Named apart, as their command lines are the server's (ps, top and the bench's monitor see these).
    (worker,) = status(pool)["worker_pids"]
    assert [Path(f"/proc/{pid}/comm").read_text().strip() for pid in (pool.server_pid, template, worker)] == [
        "kcache-server", "kcache-template", "kcache-worker"]


def test_a_template_that_holds_threads_does_not_fork_and_workers_start_by_exec(runtime: Path) -> None:
    own = CompilePool(1, None, preload=())
    pool = client.ServicePool(1, None, ("tests.pool_jobs_threaded",), 60.0, lambda: own)
    assert pool.run(pool_jobs.parent_pid) == pool.server_pid  # the server's own child: exec'd
    assert status(pool)["template_pid"] is None and not own.worker_pids()
    assert "holds 2 threads" in address.log_path(pool.name).read_text()
    own.close()


def test_a_client_killed_mid_job_has_its_running_job_killed(runtime: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    code = CLIENT.format(project=str(PROJECT)).replace(
        "pool.run(pool_jobs.worker_pid)", f"pool.run(pool_jobs.tell_pid_and_hang, {str(fifo)!r})")
    victim = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = int(fifo.read_text())  # the job runs in this worker of the service
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert exited_within(worker, 30)  # its hang does not hold the worker forever
    pool = service_pool()
    assert pool.run(pool_jobs.double, 5) == 10
    served = status(pool)
    assert served["cancelled"] == 1 and served["running"] == 0


def test_the_doctor_shows_the_service(runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kcache
    from kcache.compile.jobs import usable_cpu_count
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD

    monkeypatch.setenv("KCACHE_COMPILE_ISOLATION", "server")
    (before,) = [f for f in kcache.doctor(tmp_path / "root") if f.check == "compile service"]
    assert not before.problem and "not running" in before.detail and "kcache server start" in before.detail
    service = client.ServicePool(None, None, TILELANG_PRELOAD, 60.0, lambda: None)  # the service the doctor names
    service.warm(1, wait=True)
    (after,) = [f for f in kcache.doctor(tmp_path / "root") if f.check == "compile service"]
    assert f"pid {service.server_pid}" in after.detail and f"of {usable_cpu_count()} workers" in after.detail
    assert "forked from template" in after.detail and not after.problem


def test_identical_jobs_in_flight_compile_once_and_each_gets_the_output(runtime: Path, tmp_path: Path) -> None:
    from kcache.compile.jobs import JobOutput

    gate, runs = tmp_path / "gate", tmp_path / "runs"
    os.mkfifo(gate)
    directories = [tmp_path / f"staging-{i}" for i in range(3)]
    for directory in directories:
        directory.mkdir()
    clients = [service_pool(), service_pool(), service_pool()]
    futures = [clients[0].submit(pool_jobs.write_output, str(directories[0]), str(gate), str(runs),
                                 output=JobOutput("the-key", str(directories[0])))]
    for index in (1, 2):  # other processes' jobs of the same key, while the first is in flight
        futures.append(clients[index].submit(pool_jobs.write_output, str(directories[index]), str(gate), str(runs),
                                             output=JobOutput("the-key", str(directories[index]))))
        assert clients[index].ping()  # the service has taken it in
    assert status(clients[0])["merged_jobs"] == 2
    gate.write_text("go")  # the one running job goes on
    assert len({future.result(timeout=60) for future in futures}) == 1  # one worker's pid, for all three
    assert runs.read_text() == "run\n"  # it ran once
    for directory in directories:
        assert {p.name: (p.read_bytes(), p.stat().st_mode & 0o777) for p in directory.iterdir()} == {
            "kernel.so": (b"\x7fELF library", 0o444), "meta.json": (b'{"key": 1}', 0o444)}


def test_identical_jobs_whose_output_is_their_result_run_once_and_each_gets_it(runtime: Path, tmp_path: Path) -> None:
    """The warm-up's toolchain identification of a root: a herd's 32 processes ask for it at once."""
    from kcache.compile.jobs import JobOutput

    gate, other_gate, runs = tmp_path / "gate", tmp_path / "other-gate", tmp_path / "runs"
    os.mkfifo(gate)
    os.mkfifo(other_gate)
    clients = [service_pool(), service_pool(), service_pool()]
    futures = []
    for client_pool in clients:
        futures.append(client_pool.submit(pool_jobs.gated_run, str(gate), str(runs), output=JobOutput("root", None)))
        assert client_pool.ping()
    other_key = clients[0].submit(pool_jobs.gated_run, str(other_gate), str(runs), output=JobOutput("other root", None))
    assert clients[0].ping() and status(clients[0])["merged_jobs"] == 2
    gate.write_text("go")
    assert len({future.result(timeout=60) for future in futures}) == 1  # one worker's pid, for all three
    other_gate.write_text("go")
    assert other_key.result(timeout=60) is not None
    assert runs.read_text() == "run\n" * 2  # once per key


def test_followers_of_a_job_whose_client_went_away_run_their_own(runtime: Path, tmp_path: Path) -> None:
    from kcache.compile.jobs import JobOutput

    gate, runs, started = tmp_path / "gate", tmp_path / "runs", tmp_path / "started"
    os.mkfifo(gate)
    os.mkfifo(started)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    leader, follower = service_pool(workers=1), service_pool(workers=1)
    leader.submit(pool_jobs.write_output, str(first), str(gate), str(runs), str(started),
                  output=JobOutput("k", str(first)))
    busy = int(started.read_text())  # the leader's job runs in this worker
    future = follower.submit(pool_jobs.write_output, str(second), str(gate), str(runs), output=JobOutput("k", str(second)))
    assert follower.ping()
    served = status(follower)
    assert served["merged_jobs"] == 1 and served["running"] == 1 and served["queued"] == 0
    leader.close()  # its client goes away: the leader's job is aborted with its worker...
    assert exited_within(busy, 30)
    gate.write_text("go")  # ...and the follower's own job, in the replacement worker, opens the gate
    assert future.result(timeout=60) != busy
    assert runs.read_text() == "run\n" and not list(first.iterdir())  # the leader never got past the gate
    assert (second / "kernel.so").read_bytes() == b"\x7fELF library"


def test_forked_workers_see_the_callers_environment_not_the_templates_import_settings(
        runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The template imports with no visible GPU and single-threaded BLAS (template.FORK_SAFE_IMPORT_ENV);
    its workers get the caller's values back, set or unset."""
    from kcache.compile.workers.template import FORK_SAFE_IMPORT_ENV

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "0")
    pool = service_pool()
    seen = pool.run(pool_jobs.environment, *FORK_SAFE_IMPORT_ENV)
    assert seen == {"CUDA_VISIBLE_DEVICES": "3", "OMP_NUM_THREADS": "8", "OPENBLAS_NUM_THREADS": None,
                    "MKL_NUM_THREADS": None, "PYTORCH_NVML_BASED_CUDA_CHECK": "0"}
    assert pool.run(pool_jobs.parent_pid) == status(pool)["template_pid"]  # and it was a forked worker
