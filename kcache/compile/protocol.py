"""The compile pool's wire format, shared by the parent and its workers.

A message is an 8-byte big-endian length and then that many bytes of
cloudpickle. Pipes only: no sockets, no shared memory, nothing to clean up.
"""

from __future__ import annotations

import importlib
import os
import struct
from typing import Any

import cloudpickle

_HEADER = struct.Struct(">Q")

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
