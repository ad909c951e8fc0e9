"""A compile worker: the process `CompilePool` runs jobs in.

Started by the pool with fork+exec (never a bare fork, so it inherits no
CUDA context and no lock held by a parent thread), or forked by the worker
template (`template`). It talks to the parent over two pipes of their own
(`protocol.PROTOCOL_FDS_ENV`); its stdin is /dev/null and its stdout and
stderr go to its log, so whatever a site hook, TileLang, TVM or nvcc print
cannot corrupt the protocol.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from kcache.compile import protocol as wire
from kcache.errors import KCacheError

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# Process names (/proc/PID/comm, what ps, top and the bench's monitor show): a forked template and its
# workers keep the server's command line, so the name is what tells them apart.
WORKER_NAME = "kcache-worker"
TEMPLATE_NAME = "kcache-template"
SERVER_NAME = "kcache-server"
PARENT_ENV = "KCACHE_POOL_PARENT"


def name_process(name: str) -> None:
    """Set this process's name (at most 15 bytes); best effort: not Linux, no name."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` (the thread that started it) ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        armed = False
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        # Without prctl, notice the parent's death by being re-parented.
        def watch() -> None:
            while os.getppid() == parent:
                threading.Event().wait(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="kcache-parent-watch", daemon=True).start()


def run_client_job(path: list[str], umask: int | None, payload: bytes) -> object:
    """Run a compile-service job as its client would have: `payload` is `(fn, args)` pickled by a
    client whose sys.path was `path` and whose umask was `umask`. A service worker is a fresh fork of
    the template for each job, so the job's sys.path is exactly its client's (less the working
    directory and relative entries: `importable_path`), set before the job is unpickled, which
    imports its modules; nothing an earlier job imported or registered is there. The umask is the
    client's for the job's files, as a worker of the client's own pool would have inherited it."""
    sys.path[:] = importable_path(path)
    fn, args = wire.cloudpickle.loads(payload)
    previous = os.umask(umask) if umask is not None else None
    try:
        return fn(*args)
    finally:
        if previous is not None:
            os.umask(previous)


def importable_path(path: list[str]) -> list[str]:
    """`path` without the entries that name the working directory ('' and '.') or any relative
    directory: kcache's processes import nothing from wherever they happen to run."""
    return [entry for entry in path if entry and os.path.isabs(entry)]


def current_umask() -> int | None:
    """This process's umask, read without changing it (os.umask would, for a moment, for every
    thread); None where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return None


def main() -> int:
    proto_in, proto_out = wire.protocol_fds()
    die_with_parent(int(os.environ[PARENT_ENV]))
    name_process(WORKER_NAME)
    faulthandler.enable()  # a segfault then leaves a Python traceback in the tail the parent reports
    prepare(wire.cloudpickle.loads(wire.recv_bytes(proto_in)))
    wire.send(proto_out, (wire.READY, os.getpid()))
    return serve(proto_in, proto_out)


def serve_forked(job_in: int, reply_out: int, stderr: int, parent: int,
                 job: tuple[Callable[..., object], tuple] | None = None) -> int:
    """The life of a worker forked from a running process (the worker template, or a client that
    compiles in a fork of itself: `caller_fork`): its own session (a kill of its group takes its nvcc
    too, and a terminal's Ctrl-C reaches its parent, not it), its output into its stderr file, its
    death with `parent`, then jobs until the job pipe closes; or, given `job` (a fork of the caller,
    which has the caller's objects in memory), that one job, unpickled from nothing."""
    os.setsid()
    os.dup2(stderr, 2)
    os.dup2(2, 1)
    die_with_parent(parent)
    name_process(WORKER_NAME)
    wire.send(reply_out, (wire.READY, os.getpid()))
    if job is not None:
        _send_reply(reply_out, _run_job(job_in, reply_out, lambda: job))
        return 0
    return serve(job_in, reply_out)


def job_outcome(reply: tuple) -> tuple[object, BaseException | None]:
    """(value, None) or (None, the job's exception) from a worker's reply; an unexpected exception
    keeps where in the worker it happened, as a note."""
    if reply[0] == wire.OK:
        return reply[1], None
    error = reply[1]
    if not isinstance(error, KCacheError) and len(reply) > 2 and reply[2]:
        error.add_note(f"in the kcache compile worker:\n{reply[2].rstrip()}")
    return None, error


def prepare(setup: dict) -> None:
    """The parent's sys.path, then the modules a job should find imported."""
    sys.path[:] = importable_path(setup["sys_path"])
    for module in setup["preload"]:
        importlib.import_module(module)


def serve(proto_in: int, proto_out: int) -> int:
    """Run jobs until the parent closes the pipe."""
    while True:
        try:
            payload = wire.recv_bytes(proto_in)
        except EOFError:  # the pool closed this worker
            return 0
        _send_reply(proto_out, _run_job(proto_in, proto_out, lambda: wire.cloudpickle.loads(payload)))


def _run_job(proto_in: int, proto_out: int, job: Callable[[], tuple]) -> tuple:
    """Unpickle (`job()`) and run one job, its calls to the caller going over these pipes: its reply."""
    global _caller
    _caller = _CallerLink(proto_in, proto_out)
    try:
        fn, args = job()
        return (wire.OK, fn(*args))
    except BaseException as err:  # noqa: BLE001 - every failure of a job goes back to the parent
        return (wire.ERR, err, traceback.format_exc())
    finally:
        _caller = None


def _send_reply(proto_out: int, reply: tuple) -> None:
    try:
        wire.send(proto_out, reply)
    except Exception as err:  # the result or exception would not pickle: send what can be sent
        text = reply[2] if reply[0] == wire.ERR else ""
        wire.send(proto_out, (wire.ERR, RuntimeError(f"the job's result could not be sent back: {err!r}"), text))


class _CallerLink:
    """The running job's way to its caller: a call goes out on the reply pipe, its answer comes back
    on the job pipe (the parent answers before it reads anything else of this job)."""

    def __init__(self, proto_in: int, proto_out: int) -> None:
        self.proto_in = proto_in
        self.proto_out = proto_out

    def call(self, name: str, args: tuple) -> object:
        # The arguments travel as bytes of their own: a compile service relays them to the caller
        # unopened (it imports nothing of what they are made of).
        wire.send(self.proto_out, (wire.CALL, name, wire.cloudpickle.dumps(args)))
        try:
            answer = wire.cloudpickle.loads(wire.recv_bytes(self.proto_in))
        except EOFError:
            raise RuntimeError(f"the caller went away while this job called its {name}") from None
        if answer[0] == wire.RAISE:
            raise answer[1]
        return answer[1]


_caller: _CallerLink | None = None


def call_caller(name: str, args: tuple) -> object:
    """Call the function `name` of the running job's caller, in the caller's process, and return what
    it returned (or raise what it raised). Only while a job runs in this worker."""
    if _caller is None:
        raise RuntimeError(f"{name}: no job of a caller runs in this process")
    return _caller.call(name, args)


if __name__ == "__main__":
    sys.exit(main())
