"""What a Triton manager (kcache.triton.manager) holds until Triton drops it: the key's lock, the
remote lease, and the private directory its compile writes into."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache.triton.roots import TritonRoots

if TYPE_CHECKING:
    from kcache.store.locks import KeyLock
    from kcache.triton.private import PrivateDirectory

log = logging.getLogger("kcache")


class Held:
    """What a manager holds until Triton drops it: the key's lock (a miss being compiled here) and
    its private directory (whose files Triton has read by then). Apart from the manager, so that
    its finalizer does not keep the manager alive."""

    def __init__(self) -> None:
        self.lock: KeyLock | None = None
        self.lease: Any = None  # the remote tiers' lease of the key, while this process compiles it
        self.private: list[PrivateDirectory] = []  # the newest is written; a full root's gives way to a temp one

    def write_private(self, filename: str, payload: bytes, where: TritonRoots) -> Path:
        """`payload` as `filename` in the private directory. Where the root's disk is full (or the
        root turned unwritable), the file goes to a private temp directory: the kernel still runs."""
        from kcache.triton.private import private_directory  # a miss's

        if not self.private:
            self.private.append(private_directory(where))
        try:
            return self.private[-1].write(filename, payload)
        except OSError as err:
            if len(self.private) > 1:  # the temporary directory failed too
                raise
            log.warning("kcache: cannot write Triton's %s under %s (%s): compiling into a private temporary "
                        "directory instead", filename, self.private[-1].path, err.strerror or err)
            self.private.append(private_directory(TritonRoots(None, (), where.lock_timeout_s)))
            return self.private[-1].write(filename, payload)

    def read_private(self, filename: str) -> bytes:
        """The bytes of `filename` as written into the private directory, read through its descriptor."""
        for directory in reversed(self.private):
            try:
                return directory.read(filename)
            except FileNotFoundError:
                continue
        raise FileNotFoundError(filename)

    def release_lock(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()

    def release(self) -> None:
        self.release_lock()
        private, self.private = self.private, []
        for directory in private:
            directory.remove()
