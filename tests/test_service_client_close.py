"""Closing a client of the compile service never lets its reader thread read another descriptor.

The protocol reads by descriptor number. A client that closed its socket while the reader was about
to read freed that number for the next open of the process; the reader then read 8 bytes (a message
header) from whatever took it: a cold sample of `stress.bench` lost the first 8 bytes of its child's
output, "result {", on an H100 (2026-11-27). A real service, a real socket and a real pipe; the
reader is held just before its read, where the race put it, and let go once the pool is closed and a
pipe is opened."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kcache.compile import protocol
from kcache.compile.fork import caller_fork

from . import pool_jobs
from .test_service import service_pool


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == caller_fork.SERVICE_READER_THREAD]


def test_a_closed_client_s_reader_never_reads_a_descriptor_opened_after_the_close(
        runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_receive = protocol.receive_reply
    after_answer = threading.Event()  # the job's answer was read: the next read is the one to hold
    held, go = threading.Event(), threading.Event()
    held_fd: list[int] = []
    held_inode: list[int] = []

    def receive_reply(fd: int, timeout_s: float | None, doing: str) -> tuple:
        if after_answer.is_set() and not held.is_set():
            held_fd.append(fd)  # the number the reader took before the close
            held_inode.append(os.fstat(fd).st_ino)
            held.set()
            assert go.wait(60), "the test never let the reader go"
        reply = real_receive(fd, timeout_s, doing)
        if reply[0] == "ok":
            after_answer.set()
        return reply

    monkeypatch.setattr(protocol, "receive_reply", receive_reply)
    before = set(_reader_threads())
    pool = service_pool()
    assert pool.run(pool_jobs.double, 21) == 42
    assert held.wait(60), "the reader never came back for the next message"
    readers = [t for t in _reader_threads() if t not in before]
    assert len(readers) == 1

    pool.close()
    read_end, write_end = os.pipe()  # the lowest free numbers: the socket's, had the close freed it
    try:
        assert held_fd[0] not in (read_end, write_end)  # the socket's number was still taken at the open
        payload = b'result {"seconds": 1.5}\n'
        os.write(write_end, payload)
        go.set()
        readers[0].join(60)
        assert not readers[0].is_alive(), "the reader did not end after the close"
        os.close(write_end)
        write_end = -1
        assert _read_all(read_end) == payload  # nothing was taken from the pipe
        assert _socket_inode(held_fd[0]) != held_inode[0]  # the reader closed its socket at its end
    finally:
        go.set()
        os.close(read_end)
        if write_end != -1:
            os.close(write_end)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _socket_inode(fd: int) -> int | None:
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None
