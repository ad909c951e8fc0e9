"""One compile worker as the pool sees it: a fresh interpreter, its pipes and its stderr file."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kcache.compile import protocol as wire
from kcache.compile.worker import PARENT_ENV
from kcache.errors import CompilePoolError

STDERR_TAIL_LINES = 25
# A worker's stderr file is emptied between jobs once it is this big.
STDERR_KEEP_BYTES = 1 << 20
# How long a worker gets to exit after its pipe closes before it is killed.
EXIT_GRACE_S = 5.0


class WorkerDied(Exception):
    """The worker process ended (its pipe closed) before it answered."""


class WorkerProcess:
    """One worker interpreter and its pipes. Used by one pool thread only."""

    def __init__(self, preload: tuple[str, ...], start_timeout_s: float) -> None:
        self._stderr = anonymous_append_file()
        package_parent = str(Path(__file__).resolve().parents[2])
        bootstrap = f"import sys; sys.path.insert(0, {package_parent!r}); from kcache.compile.worker import main; sys.exit(main())"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", bootstrap],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                env={**os.environ, PARENT_ENV: str(os.getpid())},
                start_new_session=True,  # its own process group: a kill takes its nvcc too, and Ctrl-C reaches only us
            )
        except OSError as err:
            os.close(self._stderr)
            raise CompilePoolError(f"{sys.executable} could not be started: {err}", "") from err
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._to_worker = self.proc.stdin.fileno()
        self._from_worker = self.proc.stdout.fileno()
        try:
            wire.send(self._to_worker, {"sys_path": list(sys.path), "preload": list(preload)})
            kind, pid = self._receive(start_timeout_s, "starting")
        except (WorkerDied, TimeoutError, OSError) as err:
            tail = self.stderr_tail(0)
            self.kill()
            raise CompilePoolError(f"the worker did not get ready ({err})", tail) from None
        if kind != wire.READY:
            self.kill()
            raise CompilePoolError(f"the worker answered {kind!r} instead of ready", "")
        self.pid: int = pid

    def run(self, payload: bytes, timeout_s: float | None) -> tuple:
        """Send one job, wait for its reply. Raises WorkerDied or TimeoutError (the worker is then unusable)."""
        self._trim_stderr()
        self.job_stderr_start = os.fstat(self._stderr).st_size
        try:
            wire.send_bytes(self._to_worker, payload)
        except BrokenPipeError as err:
            raise WorkerDied("the worker's pipe was closed") from err
        return self._receive(timeout_s, "running a job")

    def _receive(self, timeout_s: float | None, doing: str) -> tuple:
        poller = select.poll()
        poller.register(self._from_worker, select.POLLIN | select.POLLHUP | select.POLLERR)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if poller.poll(None if remaining is None else int(remaining * 1000) + 1):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no reply within {timeout_s:g} s while {doing}")
        try:
            return wire.cloudpickle.loads(wire.recv_bytes(self._from_worker))
        except EOFError as err:
            raise WorkerDied(f"the worker died while {doing}") from err

    def death(self) -> tuple[str | None, int | None]:
        """(signal name, exit code) of a worker whose pipe closed."""
        try:
            code = self.proc.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:  # it closed its stdout but lives on: make it dead
            self.kill()
            code = self.proc.returncode
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

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._close_fds()

    def close(self) -> None:
        """Ask the worker to exit (its stdin closes), then make sure it did."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _close_fds(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        if self._stderr >= 0:
            os.close(self._stderr)
            self._stderr = -1


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
