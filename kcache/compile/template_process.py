"""A pool's handle on its worker template (`template`): start it, ask it to fork, ask it to reap.

The template is one more interpreter started by fork+exec, like a worker, that imports what a
worker would and then forks workers on request. Requests are serialized (one lock): the template
is single-threaded by design. If it dies, `TemplateGone` tells the pool to start its workers
another way; its workers die with it (PR_SET_PDEATHSIG), as an exec'd worker dies with the pool.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

from kcache.compile import protocol as wire
from kcache.compile.interpreter import start_interpreter
from kcache.compile.protocol import receive_reply
from kcache.compile.template import CONTROL_ENV, FORK_SAFE_IMPORT_ENV, MESSAGE_BYTES, RESTORE_ENV
from kcache.errors import CompilePoolError


class TemplateGone(OSError):
    """The worker template ended or stopped answering: start workers by exec."""


class WorkerTemplate:
    """The template process, as its pool sees it."""

    def __init__(self, preload: tuple[str, ...], start_timeout_s: float, stderr: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        setup_read, setup_write = os.pipe2(os.O_CLOEXEC)
        ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
        # No library threads and no CUDA while the template imports (see template.py); the caller's
        # values come back before the first fork, so workers see the caller's environment.
        restore = {name: os.environ.get(name) for name in FORK_SAFE_IMPORT_ENV}
        try:
            self.proc = start_interpreter(
                "kcache.compile.template", (setup_read, ready_write), stderr,
                {**FORK_SAFE_IMPORT_ENV, CONTROL_ENV: str(theirs.fileno()), RESTORE_ENV: json.dumps(restore)},
                extra_fds=(theirs.fileno(),),
            )
        except CompilePoolError:
            ours.close()
            for fd in (setup_write, ready_read):
                os.close(fd)
            raise
        finally:
            theirs.close()
            os.close(setup_read)
            os.close(ready_write)
        self._control = ours
        self._lock = threading.Lock()
        try:
            wire.send(setup_write, {"sys_path": list(sys.path), "preload": list(preload)})
            reply = receive_reply(ready_read, start_timeout_s, "starting the worker template")
        except Exception as err:  # noqa: BLE001 - whatever it was, the template is not usable
            self.close()
            raise TemplateGone(f"the worker template did not get ready: {err}") from None
        finally:
            os.close(setup_write)
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
        """Its control socket closes, so it exits; killed if it does not."""
        self._control.close()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
