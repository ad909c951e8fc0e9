"""The toolchain fingerprint that goes into every kernel key.

It names TileLang's version, a content hash of its native libraries (a
rebuilt libtilelang.so can change generated code without changing the
version) and nvcc's version (TileLang's own key leaves nvcc out).

Hashing ~100 MB of libraries and running `nvcc --version` cost a few
hundred milliseconds, too much for a disk hit in a fresh process. So the
fingerprint is memoized per process and persisted under
`<root>/.toolchain/`, keyed by a stat signature (path, size, mtime, inode)
of every file it was computed from. Replacing any of those files changes
the signature and forces a recomputation.

The signature and the memo lookup are on the hit path and live in
`kcache.tilelang.fingerprint`; this module (the recomputation) loads only on a memo miss.

A fresh root's memo misses in every process that opens it at once: a job's 32 ranks, say. Each
hashing the same 105 MB on a machine of 16 cores took about half a second where one hash takes a
quarter, and in a herd that opened its cache before `import tilelang` (the fingerprint is then
computed at the first lookup) that half second came after the barrier. So one process of the root
hashes, under `<root>/.locks/toolchain-<signature>.lock`, and the others wait for its memo; a
process that cannot take the lock, or waits past TOOLCHAIN_LOCK_WAIT_S, hashes on its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kcache.errors import CacheLockTimeout
from kcache.keys import ENTRY_FORMAT
from kcache.store import layout, sharing
from kcache.store.dirfd import open_root
from kcache.store.fsutil import make_dir, make_dirs_at, replace_file_at
from kcache.store.locks import KeyLock

log = logging.getLogger("kcache")

# A hash takes a fraction of a second: a holder this slow is stuck, and hashing beside it is cheaper
# than waiting on.
TOOLCHAIN_LOCK_WAIT_S = 60.0
HASH_CHUNK_BYTES = 1 << 20
MemoReader = Callable[[Path, str], "dict[str, object] | None"]


def compute_and_persist(root: Path, signature: str, libraries: list[str], compiler: str,
                        persist: bool = True) -> dict[str, object]:
    fingerprint = _compute([Path(p) for p in libraries], Path(compiler))
    if persist:
        _persist(Path(root), f"{signature}.json", fingerprint)
    return fingerprint


def identify_once(root: Path, signature: str, libraries: list[str], compiler: str,
                  read_memo: MemoReader) -> dict[str, object]:
    """The fingerprint of `signature` for `root`: hashed here under the root's toolchain lock, or read
    from the memo of the process that held it. Never fails for the lock's sake: without it, this
    process hashes on its own."""
    lock = KeyLock(root / layout.LOCKS / f"toolchain-{signature}.lock", f"toolchain-{signature}")
    try:
        # Into an existing root only: a service worker may run this for a process whose root was
        # removed since (a harness that inspected a temporary root, then deleted it).
        make_dir(root / layout.LOCKS, exist_ok=True)
        waited = lock.acquire(TOOLCHAIN_LOCK_WAIT_S, lambda: read_memo(root, signature) is not None)
    except (CacheLockTimeout, OSError) as err:  # a read-only .locks, a planted link, a stuck holder
        log.debug("kcache: identifying the toolchain without its lock %s: %s", lock.path, err)
        return compute_and_persist(root, signature, libraries, compiler)
    if waited is None:  # another process's memo appeared while we waited
        return read_memo(root, signature) or compute_and_persist(root, signature, libraries, compiler)
    with lock:  # its holder before us may have written the memo
        return read_memo(root, signature) or compute_and_persist(root, signature, libraries, compiler)


def _nvcc_version(compiler: Path) -> str:
    try:
        done = subprocess.run([str(compiler), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unavailable ({type(err).__name__}: {err})"
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    # "Cuda compilation tools, release 13.0, V13.0.88" and "Build cuda_13.0.r13.0/...".
    return " | ".join(lines[-2:]) if done.returncode == 0 and lines else f"unavailable (exit {done.returncode})"


def _file_sha256(path: Path) -> str:
    """A library's sha256, streamed through one buffer from a descriptor that refuses a link: a whole
    read of the 72 MB libtvm_compiler.so cost more than its hash (0.09 s against 0.06 s, CPU machine)."""
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW), "rb", buffering=0) as file:
        while read := file.readinto(buffer):
            digest.update(view[:read])  # hashlib releases the GIL for a chunk this size
    return digest.hexdigest()


def _compute(libraries: list[Path], compiler: Path) -> dict[str, object]:
    """The libraries hashed and nvcc asked its version at once, each in a thread: the hash releases the
    GIL, so the time is the largest library's (about 0.07 s on the CPU machine, against 0.22 s one after
    the other with whole reads). A cache opened before `import tilelang`, on a fresh root, pays it in
    its first call."""
    import tilelang

    with ThreadPoolExecutor(max_workers=len(libraries) + 1, thread_name_prefix="kcache-toolchain") as threads:
        nvcc = threads.submit(_nvcc_version, compiler)
        hashes = {p.name: threads.submit(_file_sha256, p) for p in libraries}
        return {
            "entry_format": ENTRY_FORMAT,
            "tilelang": tilelang.__version__,
            "tilelang_libs": {name: future.result() for name, future in hashes.items()},
            "nvcc": nvcc.result(),
            "machine": platform.machine(),
        }


def _persist(root: Path, name: str, fingerprint: dict[str, object]) -> None:
    """Best effort: a read-only root just recomputes the fingerprint per process. By descriptor: a
    `.toolchain` that is a link is refused, never written through, and a root removed meanwhile (a
    service worker may persist for a process that removed its temporary root since) stays removed."""
    try:
        root_fd = open_root(root)
        try:
            memo_dir = make_dirs_at(root_fd, layout.TOOLCHAIN)
        finally:
            os.close(root_fd)
        try:
            replace_file_at(memo_dir, name, json.dumps(fingerprint, sort_keys=True).encode(),
                            sharing.WRITE_ONCE_FILE_MODE)
        finally:
            os.close(memo_dir)
    except OSError as err:
        log.debug("kcache: could not persist the toolchain fingerprint %s under %s: %s", name, root, err)
