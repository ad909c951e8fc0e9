"""The compile pool's wire format, shared by the parent and its workers.

A message is an 8-byte big-endian length and then that many bytes of
cloudpickle. Pipes only: no sockets, no shared memory, nothing to clean up.
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

# The compile service's message format: part of the service's name (service_address.identity), so a
# client never talks to a running server of another format (one started before kcache was upgraded
# in place). Raise it with any change to the messages of service.py and service_client.py.
SERVICE_PROTOCOL = 2

# Worker -> parent replies.
READY = "ready"
OK = "ok"
ERR = "err"


def send(fd: int, message: Any) -> None:
    send_bytes(fd, cloudpickle.dumps(message))


def send_bytes(fd: int, payload: bytes) -> None:
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def recv_bytes(fd: int) -> bytes:
    """One message's payload. EOFError when the other end closed (or died) before a whole message."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    return _read_exactly(fd, size)


def _read_exactly(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the pipe closed mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class WorkerDied(Exception):
    """The worker process ended (its pipe closed) before it answered."""


def receive_reply(fd: int, timeout_s: float | None, doing: str) -> tuple:
    """The next message on `fd`. TimeoutError past timeout_s; WorkerDied if the writer closed or died."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if poller.poll(None if remaining is None else int(remaining * 1000) + 1):
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no reply within {timeout_s:g} s while {doing}")
    try:
        return cloudpickle.loads(recv_bytes(fd))
    except EOFError as err:
        raise WorkerDied(f"the worker died while {doing}") from err


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
