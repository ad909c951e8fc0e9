"""The compile pool's wire format, shared by the parent and its workers.

A message is an 8-byte big-endian length and then that many bytes of
cloudpickle. A worker's pipes are descriptors of their own (PROTOCOL_FDS_ENV),
never its stdin or stdout; no shared memory, nothing to clean up.
"""

from __future__ import annotations

import importlib
import os
import select
import struct
import time
from typing import Any

import cloudpickle

_HEADER = struct.Struct(">Q")

# The compile service's message format: part of the service's name (service.address.identity), so a
# client never talks to a running server of another format (one started before kcache was upgraded
# in place). Raise it with any change to the messages of service/server.py and service/client.py.
SERVICE_PROTOCOL = 6  # 3: jobs carry the client's umask; 4: the greeting and ("warmed",) say when it is warm;
# 5: a job calls functions of its caller ("call" / "return"); 6: a job carries its estimated cost

# Worker -> parent replies.
READY = "ready"
OK = "ok"
ERR = "err"
# Worker -> parent, mid-job: (CALL, name, args), a function of the job's caller to call there; the
# parent answers on the job pipe with (RETURN, value) or (RAISE, exception), and the job goes on.
CALL = "call"
RETURN = "return"
RAISE = "raise"


def send(fd: int, message: Any) -> None:
    send_bytes(fd, cloudpickle.dumps(message))


def answer_bytes(answer: tuple) -> bytes:
    """A call's answer, (RETURN, value) or (RAISE, exception), pickled; one that will not pickle (an
    exception holding a lock, say) is said in words."""
    try:
        return cloudpickle.dumps(answer)
    except Exception as err:  # noqa: BLE001 - whatever pickling the value raises
        return cloudpickle.dumps((RAISE, RuntimeError(f"the caller's answer could not be sent: {err!r}")))


def send_bytes(fd: int, payload: bytes) -> None:
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def recv_bytes(fd: int) -> bytes:
    """One message's payload. EOFError when the other end closed (or died) before a whole message."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    return _read_exactly(fd, size)


def _read_exactly(fd: int, size: int, deadline: float | None = None, doing: str = "") -> bytes:
    """`size` bytes; with a deadline (time.monotonic()), TimeoutError when they are not all there by then."""
    chunks = []
    while size:
        if deadline is not None:
            _wait_readable(fd, max(0.0, deadline - time.monotonic()), f"{doing} (the rest of a message)")
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the pipe closed mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class WorkerDied(Exception):
    """The worker process ended (its pipe closed) before it answered."""


class ReplyUnreadable(Exception):
    """A whole reply arrived but could not be unpickled here (an exception class whose constructor
    wants other arguments, say). The worker is fine; the job's answer is lost."""


# Once a message has begun, the rest must follow within this long: a worker writes a message in one
# go, so a stall mid-message is a stopped or wedged worker, never a slow compile.
MESSAGE_DEADLINE_S = 60.0
# The environment variable naming a worker's protocol descriptors ("IN,OUT"): descriptors of their
# own, never 0, 1 or 2, where a site hook, a conda activation or a debug print may write first.
PROTOCOL_FDS_ENV = "KCACHE_PROTOCOL_FDS"


def protocol_fds() -> tuple[int, int]:
    """A worker's (in, out) protocol descriptors, from PROTOCOL_FDS_ENV (then removed, so that
    nothing this worker starts inherits the name)."""
    read_fd, write_fd = os.environ.pop(PROTOCOL_FDS_ENV).split(",")
    return int(read_fd), int(write_fd)


def receive_reply(fd: int, timeout_s: float | None, doing: str) -> tuple:
    """The next message on `fd`. TimeoutError past timeout_s (for its first byte); WorkerDied if the
    writer closed, died, or left a message unfinished for MESSAGE_DEADLINE_S; ReplyUnreadable if it
    cannot be unpickled."""
    _wait_readable(fd, timeout_s, doing)
    try:
        header = _read_exactly(fd, _HEADER.size, time.monotonic() + MESSAGE_DEADLINE_S, doing)
        (size,) = _HEADER.unpack(header)
        payload = _read_exactly(fd, size, time.monotonic() + MESSAGE_DEADLINE_S, doing)
    except EOFError as err:
        raise WorkerDied(f"the worker died while {doing}") from err
    except TimeoutError as err:  # a message begun and not finished: the worker is stuck, not slow
        raise WorkerDied(f"the worker stopped in the middle of a message while {doing}") from err
    try:
        return cloudpickle.loads(payload)
    except Exception as err:  # noqa: BLE001 - whatever the payload's classes do when rebuilt
        raise ReplyUnreadable(f"{type(err).__name__}: {err}") from err


def readable_within(fd: int, timeout_s: float | None) -> bool:
    """Whether `fd` is readable (or hung up) within timeout_s (None: no limit). poll, never select:
    select cannot watch a descriptor numbered 1024 or more, and a process with CUDA, torch and many
    connections open has such descriptors (the H100's stress run did)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000) + 1)))


def _wait_readable(fd: int, timeout_s: float | None, doing: str) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if poller.poll(None if remaining is None else int(remaining * 1000) + 1):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no reply within {timeout_s:g} s while {doing}")


class CallByName:
    """A picklable reference to `module.function`, resolved in the worker.

    The parent sends the compile function without importing its module (the
    compile path of TileLang costs ~100 ms to import, and a parent that only
    hits the cache never needs it).
    """

    __slots__ = ("module", "function")

    def __init__(self, module: str, function: str) -> None:
        self.module = module
        self.function = function

    def __call__(self, *args: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.function)(*args)

    def __reduce__(self) -> tuple:
        return (CallByName, (self.module, self.function))

    def __repr__(self) -> str:
        return f"{self.module}.{self.function}"
