"""A compile in a fork of the calling process, while the compile service is not warm yet.

A process that imported TileLang before its first miss, with no warm service on the machine, would
otherwise wait for the service to start and its template to import TileLang again: on the H100, a
herd of 32 such processes took 2.63x one compile. A fork of the caller has TileLang imported
already, so the job starts at once; the service is started once the job is done, for the compiles
that follow (started beside the fork, its own imports slowed the fork's nvcc by up to 30% on an H100).

The fork is a compile worker like the service's (`worker.serve_forked`): the same job code, run
on the caller's own objects in memory (nothing is pickled into it, so nothing can arrive changed),
its calls to the caller's callbacks answered by the caller over its pipes, its own session (a
timeout kills it and its nvcc; a Ctrl-C reaches the caller, which kills it), its output in its own
stderr file, SIGKILLed when the caller dies; a crash or a hang costs the caller
`CompilerCrashed` or `CompileTimeout`, as from a worker of the service. The caller reaps it before it
returns, so nothing the child inherited (the key lock's descriptor, say) outlives the compile.

When (`unsafe_reason`), else the job goes to the service:
- the job's modules (the pool's preload: TileLang) are imported here, or the fork saves nothing
  (nor with no preload at all);
- no Python thread runs but the caller's, the service client's own (its reader and its starter) and
  the cache's warm-up of the service (`KernelCache.warm_compiles`: it reaches the service as the
  starter does, sends to it, and waits for its job's future), none of which holds a lock a job
  takes: a lock another thread holds at the fork stays locked in the child forever. Native threads
  are not copied and hold nothing the compile takes: the job touches neither CUDA (the tvm_ffi
  backend, kcache's only one, loads nothing at compile time) nor BLAS, whose library (OpenBLAS)
  shuts its threads down around a fork itself;
- `KCACHE_CALLER_FORK` is not 0;
- a compile slot is free (`compile_slots`): the machine-wide bound holds for these compiles too.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from kcache.compile.protocol import ReplyUnreadable, WorkerDied
from kcache.compile.workers.template import reap
from kcache.compile.workers.template_process import WorkerTemplate
from kcache.compile.workers.worker import job_outcome, serve_forked
from kcache.compile.workers.worker_process import STDERR_TAIL_LINES, CallsOfCaller, Child, ReapedChild, WorkerProcess
from kcache.errors import CompilerCrashed, CompileTimeout, WorkerStartFailed

# The compile service client's threads (`service.client`) and the cache's warm-up of it, the only ones
# a fork may leave behind: the reader blocks reading its socket, the starter starts the service (a
# subprocess, a flock, a pipe), the warm-up reaches it as the starter does, sends, and waits on a
# future; a job in the fork takes none of the locks they hold (the client's own, the start lock's flock).
# A cache opened before `import tilelang` has its warm-up waiting for the service's template: had
# the thread kept the first compile out of a fork, that compile would have waited for the template.
SERVICE_READER_THREAD = "kcache-service-reader"
SERVICE_START_THREAD = "kcache-service-start"
SERVICE_WARM_THREAD = "kcache-service-warm"
KCACHE_THREADS = frozenset({SERVICE_READER_THREAD, SERVICE_START_THREAD, SERVICE_WARM_THREAD})
# How long the fork gets to answer that it is ready (it imports nothing: a fork is milliseconds).
READY_TIMEOUT_S = 30.0
# How much of a crashed fork's output is read: its traceback holds every frame of the caller's stack.
CALLER_STACK_LINES = 1000
# How much of a fork's output reaches its caller's stderr once it answered (within the last 64 KiB).
RELAYED_LINES = 2000


def unsafe_reason(preload: Iterable[str]) -> str | None:
    """Why this process should not compile in a fork of itself now, or None when it may."""
    if not hasattr(os, "fork"):
        return "this platform has no fork"
    preload = tuple(preload)
    if not preload:
        return "the jobs import nothing ahead, so a fork saves nothing"
    for module in preload:
        if module.partition(".")[0] not in sys.modules:
            return f"{module} is not imported in this process"
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and thread.name not in KCACHE_THREADS:
            return f"the thread {thread.name!r} runs beside the caller"
    return None


class CallerForkChild(ReapedChild):
    """The fork, a child of the calling process: reaped here."""

    def _reap(self, timeout_s: float) -> int | None:
        return reap(self.pid, timeout_s)


class CallerForkWorker(WorkerProcess):
    """A WorkerProcess whose process is a fork of this one, running one job: `fn(*args)`, the
    caller's own objects in memory, pickled into nothing."""

    def __init__(self, fn: Callable[..., Any], args: tuple, start_timeout_s: float) -> None:
        self._job = (fn, args)
        super().__init__((), start_timeout_s)

    def _start_child(self, job_read: int, reply_write: int, template: WorkerTemplate | None) -> Child:
        parent = os.getpid()
        ours = (self._to_worker, self._from_worker)
        with warnings.catch_warnings():
            # Python 3.12 warns of any fork of a process with native threads (OpenBLAS's, the CUDA
            # driver's); the module docstring says why this one is safe.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid:
            return CallerForkChild(pid)
        code = 1
        try:  # the fork: it never returns into the caller's code
            gc.freeze()  # a collection would touch (and copy) every object of the caller
            _no_handlers_of_the_caller()
            for fd in ours:  # the job pipe's write end here would keep it from ever seeing EOF
                os.close(fd)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
            # The caller's sys.stdout and sys.stderr may be anything (a notebook's stream, a test
            # runner's capture): the fork's write to descriptors 1 and 2, which serve_forked points
            # at its stderr file, as a worker's, and so does the traceback of a crash (faulthandler
            # keeps the descriptor it was enabled with).
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - for the fork's life
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            faulthandler.enable(file=2)
            code = serve_forked(job_read, reply_write, self._stderr, parent, self._job)
        except BaseException:  # noqa: BLE001 - whatever happens, the child must not run its caller's code
            pass
        os._exit(code)


def _no_handlers_of_the_caller() -> None:
    """The fork's signals to their defaults: a handler of the program (a scheduler's SIGTERM saving a
    checkpoint, a Ctrl-C's KeyboardInterrupt) runs in the program only, never in a fork that compiles.
    A signal meant for the fork ends it with its own status (the caller's wait then reports how)."""
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
            if callable(handler):
                signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP, or a number the platform lacks
            continue


def without_caller_frames(text: str) -> str:
    """A crash's traceback (faulthandler's) without the frames below the fork's worker loop: those
    are the caller's own, as deep as its program, and would push the job's frames and output out of
    the tail that CompilerCrashed shows."""
    kept: list[str] = []
    in_caller = False
    for line in text.splitlines():
        if line.startswith("Extension modules:"):  # Python's list of every loaded extension: hundreds, no cause
            continue
        is_frame = line.startswith("  File ")
        if in_caller and is_frame:
            continue
        in_caller = is_frame and line.endswith(f" in {serve_forked.__name__}")
        kept.append(line)
    return "\n".join(kept)


class ForkUnavailable(Exception):
    """No fork could start (fork failed, or the child did not get ready): the job did not run."""


def run_in_fork(fn: Callable[..., Any], args: tuple, name: str, timeout_s: float | None,
                forked: Callable[[], None] = lambda: None, calls: CallsOfCaller | None = None,
                relay: Callable[[str], None] | None = None) -> Any:
    """Run `fn(*args)` in a fork of this process, from memory (nothing is pickled into it), and return
    its value, or raise what it raised, CompilerCrashed or CompileTimeout; ForkUnavailable when no
    fork could start. The job's calls to its caller (`calls`) are answered in this thread. `forked()`
    runs in this process once the fork exists and before its answer is awaited (the service's
    start, say). `relay(text)`: what the fork printed (its last 64 KiB), once it answered."""
    try:
        worker = CallerForkWorker(fn, args, READY_TIMEOUT_S)
    except (WorkerStartFailed, OSError) as err:
        raise ForkUnavailable(f"{type(err).__name__}: {err}") from err
    try:
        forked()
        try:
            reply = worker.run(None, timeout_s, calls)
            if relay is not None:
                relay(worker.stderr_tail(lines=RELAYED_LINES))
            worker.close()  # the fork exits once its job is answered
        except ReplyUnreadable as err:
            raise RuntimeError(f"the answer of {name!r} came back but cannot be rebuilt in this process ({err})") from None
        except TimeoutError:
            raise CompileTimeout(name, timeout_s or 0.0) from None
        except WorkerDied:
            signal_name, exit_code = worker.death()
            tail = without_caller_frames(worker.stderr_tail(lines=CALLER_STACK_LINES))
            raise CompilerCrashed(name, signal_name, exit_code, "\n".join(tail.splitlines()[-STDERR_TAIL_LINES:])) from None
    finally:
        worker.kill()  # a fork that did not exit is killed now: reaped either way
    value, error = job_outcome(reply)
    if error is not None:
        raise error
    return value
