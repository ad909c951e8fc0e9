"""A pool's handle on its worker template (`template`): start it, ask it to fork, ask it to reap.

The template is one more interpreter started by fork+exec, like a worker, that imports what a
worker would and then forks workers on request; the compile service forks itself into its template
at its start instead (`forked=True`), which saves an interpreter's start and kcache's imports on the
path to its first compile. Requests are serialized (one lock): the template
is single-threaded by design. If it dies, `TemplateGone` tells the pool to start its workers
another way; its workers die with it (PR_SET_PDEATHSIG), as an exec'd worker dies with the pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading

from kcache.compile import protocol as wire
from kcache.compile.interpreter import start_interpreter
from kcache.compile.protocol import receive_reply
from kcache.compile.workers.template import CONTROL_ENV, FORK_SAFE_IMPORT_ENV, MESSAGE_BYTES, RESTORE_ENV, start_forked


class TemplateGone(OSError):
    """The worker template ended or stopped answering: start workers by exec."""


class WorkerTemplate:
    """The template process, as its pool sees it: started at once, ready after its imports
    (`wait_ready`, which the pool's first worker start calls)."""

    def __init__(self, preload: tuple[str, ...], start_timeout_s: float, stderr: int, *,
                 forked: bool = False) -> None:
        """`forked`: fork this process into the template (it must hold one thread: the compile
        service at its start) instead of starting a fresh interpreter."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
        self.start_timeout_s = start_timeout_s
        self.threads: list[str] | None = None  # known once ready
        try:
            if forked:
                self.proc: subprocess.Popen | ForkedChild = ForkedChild(
                    start_forked(theirs, ready_write, stderr, tuple(preload)))
            else:
                self.proc = self._exec(preload, stderr, theirs, ready_write)
        except BaseException:
            ours.close()
            os.close(ready_read)
            raise
        finally:
            theirs.close()
            os.close(ready_write)
        self.pid = self.proc.pid
        self._control = ours
        self._ready_read: int | None = ready_read
        self._lock = threading.Lock()

    @staticmethod
    def _exec(preload: tuple[str, ...], stderr: int, theirs: socket.socket, ready_write: int) -> subprocess.Popen:
        setup_read, setup_write = os.pipe2(os.O_CLOEXEC)
        # No library threads and no CUDA while the template imports (see template.py); the caller's
        # values come back before the first fork, so workers see the caller's environment.
        restore = {name: os.environ.get(name) for name in FORK_SAFE_IMPORT_ENV}
        try:
            proc = start_interpreter(
                "kcache.compile.workers.template", (setup_read, ready_write), stderr,
                {**FORK_SAFE_IMPORT_ENV, CONTROL_ENV: str(theirs.fileno()), RESTORE_ENV: json.dumps(restore)},
                extra_fds=(theirs.fileno(),),
            )
        except BaseException:
            os.close(setup_write)
            raise
        finally:
            os.close(setup_read)
        try:
            with contextlib.suppress(OSError):  # it died at once: wait_ready says so
                wire.send(setup_write, {"sys_path": list(sys.path), "preload": list(preload)})  # fits the pipe
        finally:
            os.close(setup_write)
        return proc

    def wait_ready(self) -> None:
        """Until the template has imported its preload (at once after the first call). Raises
        TemplateGone if it died or took longer than its start timeout."""
        if self._ready_read is None:
            return
        ready_read, self._ready_read = self._ready_read, None  # read once, closed once
        try:
            reply = receive_reply(ready_read, self.start_timeout_s, "starting the worker template")
        except Exception as err:  # noqa: BLE001 - whatever it was, the template is not usable
            self.close()
            raise TemplateGone(f"the worker template did not get ready: {err}") from None
        finally:
            os.close(ready_read)
        _ready, self.pid, self.threads = reply  # thread names, the main thread first

    def fork(self, fds: tuple[int, int, int]) -> int:
        """A new worker on these descriptors (job in, reply out, stderr); its pid."""
        answer = self._ask(("fork",), fds)
        return int(answer[1])

    def reap(self, pid: int, timeout_s: float) -> int | None:
        """The wait status of worker `pid` once it ended (None if it runs on after timeout_s)."""
        return self._ask(("reap", pid, timeout_s), ())[1]

    def _ask(self, request: tuple, fds: tuple[int, ...]) -> tuple:
        with self._lock:
            try:
                socket.send_fds(self._control, [wire.cloudpickle.dumps(request)], list(fds))
                data = self._control.recv(MESSAGE_BYTES)
            except OSError as err:
                raise TemplateGone(f"the worker template is gone ({err})") from None
        if not data:
            raise TemplateGone("the worker template is gone")
        answer = wire.cloudpickle.loads(data)
        if answer[0] == "error":
            raise TemplateGone(answer[1])
        return answer

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Its control socket closes, so it exits; killed if it does not. A request another thread
        has in flight (`_ask`) is woken first (the shutdown: its recv reads EOF, TemplateGone) and
        ends before the socket is closed: a number freed under it could be taken by this process's
        next open, and that thread would read or send there."""
        if self._ready_read is not None:
            os.close(self._ready_read)
            self._ready_read = None
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._control.close()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedChild:
    """The handle of a template forked by this process (`start_forked`): what the pool uses of a Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                pidfd = None
            if pidfd is not None:
                try:
                    if not wire.readable_within(pidfd, timeout):
                        raise subprocess.TimeoutExpired(f"worker template {self.pid}", timeout or 0.0)
                finally:
                    os.close(pidfd)
        if self.poll() is None:  # already reaped elsewhere
            self.returncode = 0
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
