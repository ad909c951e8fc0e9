"""The worker template: an interpreter that imported TileLang once and forks compile workers.

Started by a pool (`template_process.WorkerTemplate`) the way a worker is (fork+exec, its setup and
ready on protocol pipes of their own), it then serves requests on a SOCK_SEQPACKET control socket:

- `("fork",)` with three descriptors (the job pipe's read end, the reply pipe's write end, the
  worker's stderr file): it forks a worker that runs `worker.serve` on them, and answers its pid.
  A fork costs milliseconds where a fresh worker imports TileLang for seconds.
- `("reap", pid, timeout_s)`: it waits up to timeout_s for that worker to end and answers its
  wait status (None if it still runs). Workers are the template's children, so only it can.

A fork is only safe from a process with one thread (a lock held by another thread stays locked in
the child forever) and no CUDA context (CUDA does not survive a fork), so the template starts no
thread, never touches CUDA, and imports with FORK_SAFE_IMPORT_ENV. It reports its thread count when
ready; a pool that sees more than one starts its workers by exec instead (`template_process`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import os
import socket
import sys
import traceback

from kcache.compile import protocol as wire
from kcache.compile.workers.worker import (
    PARENT_ENV,
    TEMPLATE_NAME,
    die_with_parent,
    name_process,
    prepare,
    serve_forked,
)

CONTROL_ENV = "KCACHE_TEMPLATE_CONTROL"
# What the template imports with, so that the imports leave it with one thread and no CUDA context:
# the thread pools of BLAS and OpenMP off (numpy's OpenBLAS and torch's OpenMP start their threads at
# import), and no CUDA driver. tvm_ffi and TileLang ask `torch.cuda.is_available()` at import; torch
# answers it with cuInit, and the driver starts a thread ("cuda00001400006" on the H100) even when
# CUDA_VISIBLE_DEVICES hides every GPU. With PYTORCH_NVML_BASED_CUDA_CHECK=1 torch counts devices
# through NVML instead, which honours CUDA_VISIBLE_DEVICES="" and starts no thread: measured on the
# H100, the template then holds one thread; either variable alone left the driver's thread. The
# caller's values come back after the imports (RESTORE_ENV), so workers see the caller's environment.
FORK_SAFE_IMPORT_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                        "CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
# JSON {name: the caller's value, or null where it was not set}: put back after the imports.
RESTORE_ENV = "KCACHE_TEMPLATE_RESTORE"
FORK_FDS = 3
MESSAGE_BYTES = 4096


def thread_names() -> list[str]:
    """This process's threads by name (the kernel's comm), itself first: what a fork would not copy."""
    names = []
    for tid in sorted(os.listdir("/proc/self/task"), key=lambda t: t != str(os.getpid())):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile is no longer a reason not to fork
            continue
    return names


def main() -> int:
    """The template as a fresh interpreter (`template_process.WorkerTemplate`, exec)."""
    proto_in, proto_out = wire.protocol_fds()
    die_with_parent(int(os.environ[PARENT_ENV]))
    name_process(TEMPLATE_NAME)
    faulthandler.enable()  # inherited by every worker: a segfault leaves a traceback in its stderr
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_ENV)))
    setup = wire.cloudpickle.loads(wire.recv_bytes(proto_in))
    prepare(setup)
    warm_up(setup["preload"])
    restore_environment(json.loads(os.environ.pop(RESTORE_ENV, "{}")))
    wire.send(proto_out, (wire.READY, os.getpid(), thread_names()))
    os.close(proto_in)
    os.close(proto_out)
    return serve_forks(control)


def start_forked(control: socket.socket, ready_out: int, stderr: int, preload: tuple[str, ...]) -> int:
    """The template as a fork of the calling process, which must hold one thread (the compile service
    at its start, before anything else): the child imports `preload` at once, with no interpreter to
    start and nothing of kcache to import again. Its pid; the child answers READY on `ready_out`, as
    `main` does, and never returns."""
    parent = os.getpid()
    keep = {control.fileno(), ready_out, stderr}
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the template: it never returns into the caller
        for name in os.listdir("/proc/self/fd"):  # the server's lock, listener, starter pipe: not ours
            if int(name) > 2 and int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        os.setsid()  # its own session, as an exec'd template's (start_new_session)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(stderr, 2)
        os.dup2(stderr, 1)
        os.close(stderr)
        die_with_parent(parent)
        name_process(TEMPLATE_NAME)
        faulthandler.enable()
        callers = {name: os.environ.get(name) for name in FORK_SAFE_IMPORT_ENV}
        os.environ.update(FORK_SAFE_IMPORT_ENV)
        prepare({"sys_path": list(sys.path), "preload": list(preload)})
        warm_up(preload)
        restore_environment(callers)
        wire.send(ready_out, (wire.READY, os.getpid(), thread_names()))
        os.close(ready_out)
        code = serve_forks(control)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not run its parent's code
        traceback.print_exc()
    finally:
        os._exit(code)


def warm_up(preload: list[str] | tuple[str, ...]) -> None:
    """Let each preloaded module that has one run its `warm_up_template()` (kcache.tilelang.compiler:
    one small lowering, kcache/tilelang/warm_up.py), still under FORK_SAFE_IMPORT_ENV, so that every
    worker forked from here starts past what a process's first job would initialize."""
    for name in preload:
        hook = getattr(sys.modules.get(name), "warm_up_template", None)
        if callable(hook):
            hook()


def restore_environment(values: dict[str, str | None]) -> None:
    """The caller's values of the import settings (None: unset): the libraries read them at import;
    the workers get the caller's environment."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def serve_forks(control: socket.socket) -> int:
    """Answer fork and reap requests until the pool closes its end. First, everything the template
    made is frozen out of the collector (`gc.freeze`, as Python's docs advise before forks): a worker's
    collection would otherwise walk, and so copy, every page of the template's heap (the imported
    compiler's objects), one copy-on-write fault a page, slow where faults are costly (gVisor)."""
    gc.collect()  # the warm-up's garbage, not frozen with the rest
    gc.freeze()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, MESSAGE_BYTES, FORK_FDS)
        except ConnectionError:
            return 0
        if not data:  # the pool closed its end
            return 0
        request = wire.cloudpickle.loads(data)
        if request[0] == "fork":
            answer: object = ("forked", fork_worker(fds, control))
        elif request[0] == "reap":
            answer = ("reaped", reap(request[1], request[2]))
        else:
            answer = ("error", f"unknown request {request[0]!r}")
        for fd in fds:
            os.close(fd)
        control.sendall(wire.cloudpickle.dumps(answer))


def fork_worker(fds: list[int], control: socket.socket) -> int:
    job_in, reply_out, stderr = fds
    template = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # the worker: it never returns into the template's loop
        control.close()
        code = serve_forked(job_in, reply_out, stderr, template)  # and the template dies with the pool's owner
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not run the template's loop
        code = 1
    os._exit(code)


def reap(pid: int, timeout_s: float) -> int | None:
    """Only on request, never on its own: until the pool has its status, a dead worker stays a
    zombie, so its pid (and process group) cannot be reused by another process the pool might
    then signal."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        wire.readable_within(pidfd, timeout_s)
    finally:
        os.close(pidfd)
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if done else None


if __name__ == "__main__":
    sys.exit(main())
