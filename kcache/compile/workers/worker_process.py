"""One compile worker as the pool sees it: its process (exec'd or forked), its pipes and its stderr file."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Protocol

from kcache.compile import protocol as wire
from kcache.compile.interpreter import start_interpreter
from kcache.compile.protocol import ReplyUnreadable, WorkerDied, receive_reply
from kcache.compile.workers.template_process import TemplateGone, WorkerTemplate
from kcache.errors import WorkerStartFailed

# A job's calls to its caller (`worker.call_caller`): (name, pickled args) -> the pickled answer,
# (RETURN, value) or (RAISE, exception), made where the job's caller is (`caller_calls.CallerCalls`,
# or the compile service's relay to its client, which passes both on unopened).
CallsOfCaller = Callable[[str, bytes], bytes]

STDERR_TAIL_LINES = 25
# A worker's stderr file is emptied between jobs once it is this big.
STDERR_KEEP_BYTES = 1 << 20
# How long a worker gets to exit after its pipe closes before it is killed.
EXIT_GRACE_S = 5.0


class ExecChild:
    """A worker started by fork+exec: a child of the pool's process."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid

    def wait(self, timeout_s: float) -> int | None:
        """Its return code once it ended (negative: the signal), None if it runs on after timeout_s."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        kill_group(self.pid)
        self.proc.wait()


class ReapedChild:
    """A worker that is not a Popen: its wait status comes from `_reap`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reap(self, timeout_s: float) -> int | None:
        """Its wait status once it ended within timeout_s, else None."""
        raise NotImplementedError

    def wait(self, timeout_s: float) -> int | None:
        if self.returncode is None:
            status = self._reap(timeout_s)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:  # once reaped, its pid may be another process's
            kill_group(self.pid)
            self.wait(EXIT_GRACE_S)


class ForkedChild(ReapedChild):
    """A worker forked by the worker template: the template's child, so the template reaps it."""

    def __init__(self, template: WorkerTemplate, pid: int) -> None:
        super().__init__(pid)
        self.template = template

    def _reap(self, timeout_s: float) -> int | None:
        # The wait is this process's, on a pidfd of its own; the template is asked only once the worker
        # ended. A wait in the template would hold its one channel, and every other pool thread's fork
        # behind it: with 16 workers each replaced after a 0.3 s job, that wait was most of the 12 ms
        # a job waited for its fresh worker on the H200 (issue 67).
        waited = timeout_s <= 0 or exited_within(self.pid, timeout_s) is not None
        try:
            return self.template.reap(self.pid, 0.0 if waited else timeout_s)
        except TemplateGone:
            return None  # it died with the template (PR_SET_PDEATHSIG), its status lost

    def kill(self) -> None:
        if self.template.alive:  # else it died with the template, and whoever adopted it reaped it: its
            super().kill()  # pid may be another process's by now, which a kill would hit


def exited_within(pid: int, timeout_s: float) -> bool | None:
    """Whether process `pid` (a worker not yet reaped, so the pid is still its own) ended within
    timeout_s; None where no pidfd can be had here (a kernel before 5.3)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        return None
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))
    finally:
        os.close(pidfd)


class Child(Protocol):
    """A worker's process as WorkerProcess drives it."""

    pid: int

    def wait(self, timeout_s: float) -> int | None: ...

    def kill(self) -> None: ...


def kill_group(pid: int) -> None:
    """SIGKILL a worker's process group (it and its nvcc), and the worker itself in case it was
    killed before it made its group."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class WorkerProcess:
    """One worker process and its pipes. Used by one pool thread only.

    Started by fork+exec of a fresh interpreter, or, given a `template`, forked by the worker
    template (milliseconds instead of an import of TileLang).
    """

    def __init__(self, preload: tuple[str, ...], start_timeout_s: float, template: WorkerTemplate | None = None) -> None:
        self._stderr = anonymous_append_file()
        self.job_stderr_start = 0
        job_read, self._to_worker = os.pipe2(os.O_CLOEXEC)
        self._from_worker, reply_write = os.pipe2(os.O_CLOEXEC)
        try:
            self._child = self._start_child(job_read, reply_write, template)
        except BaseException:
            for fd in (self._to_worker, self._from_worker, self._stderr):
                os.close(fd)
            raise
        finally:
            os.close(job_read)
            os.close(reply_write)
        self.pid: int = self._child.pid
        try:
            if isinstance(self._child, ExecChild):  # a fork has its parent's modules already
                wire.send(self._to_worker, {"sys_path": list(sys.path), "preload": list(preload)})
            kind, _pid = self._receive(start_timeout_s, "starting")
        except (WorkerDied, TimeoutError, OSError, ReplyUnreadable) as err:
            tail = self.stderr_tail(0)
            self.kill()
            raise WorkerStartFailed(f"the worker did not get ready within {start_timeout_s:g} s ({err})"
                                    if isinstance(err, TimeoutError) else f"the worker did not get ready ({err})",
                                    tail) from None
        if kind != wire.READY:
            self.kill()
            raise WorkerStartFailed(f"the worker answered {kind!r} instead of ready", self.stderr_tail(0))

    def _start_child(self, job_read: int, reply_write: int, template: WorkerTemplate | None) -> Child:
        """The worker's process, given its ends of the pipes (the caller closes them after)."""
        if template is None:
            return ExecChild(start_interpreter("kcache.compile.workers.worker", (job_read, reply_write), self._stderr, {}))
        return ForkedChild(template, template.fork((job_read, reply_write, self._stderr)))

    def run(self, payload: bytes | None, timeout_s: float | None, calls: CallsOfCaller | None = None) -> tuple:
        """Send one job (None: the worker has it already, a fork of the caller), wait for its reply,
        answering its calls to the caller with `calls` meanwhile. Raises WorkerDied or TimeoutError
        (the worker is then unusable)."""
        if payload is not None:  # else the job started with the worker: its whole stderr is the job's
            self._trim_stderr()
            self.job_stderr_start = os.fstat(self._stderr).st_size
            try:
                wire.send_bytes(self._to_worker, payload)
            except BrokenPipeError as err:
                raise WorkerDied("the worker's pipe was closed") from err
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            reply = self._receive(remaining, "running a job")
            if reply[0] != wire.CALL:
                return reply
            answer = answer_call(calls, reply[1], reply[2])
            try:
                wire.send_bytes(self._to_worker, answer)
            except BrokenPipeError as err:
                raise WorkerDied("the worker's pipe was closed") from err

    def _receive(self, timeout_s: float | None, doing: str) -> tuple:
        return receive_reply(self._from_worker, timeout_s, doing)

    def death(self) -> tuple[str | None, int | None]:
        """(signal name, exit code) of a worker whose pipe closed."""
        code = self._child.wait(EXIT_GRACE_S)
        if code is None:  # it closed its stdout but lives on: make it dead
            self._child.kill()
            code = self._child.wait(0)
        if code is not None and code < 0:
            try:
                return signal.Signals(-code).name, None
            except ValueError:
                return f"signal {-code}", None
        return None, code

    def stderr_tail(self, start: int | None = None, lines: int = STDERR_TAIL_LINES) -> str:
        begin = self.job_stderr_start if start is None else start
        try:
            end = os.fstat(self._stderr).st_size
            begin = max(begin, end - 64 * 1024)
            text = os.pread(self._stderr, end - begin, begin).decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _trim_stderr(self) -> None:
        try:
            if os.fstat(self._stderr).st_size > STDERR_KEEP_BYTES:
                os.ftruncate(self._stderr, 0)  # the worker writes with O_APPEND: it follows the new end
        except OSError:
            pass

    @property
    def template(self) -> WorkerTemplate | None:
        """The template that forked it; None for a worker started by exec."""
        return self._child.template if isinstance(self._child, ForkedChild) else None

    def has_exited(self) -> bool:
        """Whether its process has ended, asked without waiting (before a job is handed to it)."""
        if isinstance(self._child, ForkedChild):  # its template gone, it is too (and its pid may be reused)
            return not self._child.template.alive or bool(exited_within(self.pid, 0))
        return self._child.wait(0) is not None

    def send_exit(self) -> None:
        """Close its job pipe: it exits once it reads the end (`close` then waits for that)."""
        self._close_fd("_to_worker")

    def kill(self) -> None:
        self._child.kill()
        self._close_fds()

    def kill_process(self) -> None:
        """SIGKILL the worker from another thread: the thread driving it sees it die. Its pipes stay
        that thread's to close."""
        if self._child.wait(0) is None:
            kill_group(self.pid)

    def close(self) -> None:
        """Ask the worker to exit (its job pipe closes), then make sure it did."""
        self.send_exit()
        if self._child.wait(EXIT_GRACE_S) is None:
            self._child.kill()
        self._close_fds()

    def _close_fd(self, name: str) -> None:
        fd = getattr(self, name)
        if fd >= 0:
            os.close(fd)
            setattr(self, name, -1)

    def _close_fds(self) -> None:
        for name in ("_to_worker", "_from_worker", "_stderr"):
            self._close_fd(name)


def anonymous_append_file() -> int:
    """An unlinked O_APPEND file: the worker's stderr, readable here, gone when closed."""
    directory = tempfile.gettempdir()
    for _ in range(100):
        path = os.path.join(directory, f"kcache-worker-{os.getpid()}-{os.urandom(6).hex()}.stderr")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        os.unlink(path)
        return fd
    raise FileExistsError(f"could not create a worker stderr file in {directory}")


def answer_call(calls: CallsOfCaller | None, name: str, args: bytes) -> bytes:
    """The pickled answer to a job's call to its caller: (RETURN, value) or (RAISE, exception)."""
    if calls is None:
        return wire.answer_bytes((wire.RAISE, RuntimeError(f"{name}: this job was given no functions of its caller to call")))
    try:
        return calls(name, args)
    except BaseException as err:  # noqa: BLE001 - the job hears of it; this thread goes on
        return wire.answer_bytes((wire.RAISE, err))
