"""Bounded reads by descriptor: a regular file only, never through a link, never more than its
fstat size promised. Its own module, of nothing but the standard library, because every hit reads
through it (the manifest's verification): a hit loads none of fsutil's write path."""

from __future__ import annotations

import errno
import os
import stat


def read_regular_at(dir_fd: int, name: str, max_bytes: int) -> bytes:
    """Read regular file `name` of `dir_fd`, refusing a link, a FIFO or device (O_NONBLOCK: opening
    one never blocks) and anything bigger than `max_bytes` (its size from fstat, before any read)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file: {name}")
        if info.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{name} is {info.st_size} bytes, more than the {max_bytes} expected")
        return read_fd(fd, info.st_size)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int) -> bytes:
    """Exactly the `size` bytes fstat promised; a file that changed size meanwhile is an error."""
    data = os.pread(fd, size + 1, 0) if size < (1 << 20) else _read_chunks(fd, size + 1)
    if len(data) != size:
        raise OSError(errno.EIO, f"the file changed size while read ({len(data)} bytes, fstat said {size})")
    return data


def _read_chunks(fd: int, limit: int) -> bytes:
    chunks, offset = [], 0
    while offset < limit:
        chunk = os.pread(fd, min(1 << 20, limit - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
