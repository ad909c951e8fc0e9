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
    client whose sys.path was `path` and whose umask was `umask`. The service's workers serve every
    process of the environment, whatever its script's directory, so the client's entries are added
    (at the end: never shadowing the worker's own) before the job's functions are unpickled, which
    imports their modules. The umask is the client's for the job's files (a worker runs one job at
    a time), as a worker of the client's own pool would have inherited it."""
    for entry in path:
        if entry not in sys.path:
            sys.path.append(entry)
    fn, args = wire.cloudpickle.loads(payload)
    previous = os.umask(umask) if umask is not None else None
    try:
        return fn(*args)
    finally:
        if previous is not None:
            os.umask(previous)


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


def serve_forked(job_in: int, reply_out: int, stderr: int, parent: int) -> int:
    """The life of a worker forked from a running process (the worker template, or a client that
    compiles in a fork of itself: `caller_fork`): its own session (a kill of its group takes its nvcc
    too, and a terminal's Ctrl-C reaches its parent, not it), its output into its stderr file, its
    death with `parent`, then jobs until the job pipe closes."""
    os.setsid()
    os.dup2(stderr, 2)
    os.dup2(2, 1)
    die_with_parent(parent)
    name_process(WORKER_NAME)
    wire.send(reply_out, (wire.READY, os.getpid()))
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
    sys.path[:] = setup["sys_path"]
    for module in setup["preload"]:
        importlib.import_module(module)


def serve(proto_in: int, proto_out: int) -> int:
    """Run jobs until the parent closes the pipe."""
    while True:
        try:
            payload = wire.recv_bytes(proto_in)
        except EOFError:  # the pool closed this worker
            return 0
        try:
            fn, args = wire.cloudpickle.loads(payload)
            reply = (wire.OK, fn(*args))
        except BaseException as err:  # noqa: BLE001 - every failure of a job goes back to the parent
            reply = (wire.ERR, err, traceback.format_exc())
        try:
            wire.send(proto_out, reply)
        except Exception as err:  # the result or exception would not pickle: send what can be sent
            text = reply[2] if reply[0] == wire.ERR else ""
            wire.send(proto_out, (wire.ERR, RuntimeError(f"the job's result could not be sent back: {err!r}"), text))


if __name__ == "__main__":
    sys.exit(main())
