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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import subprocess
import uuid
from pathlib import Path

from kcache.keys import ENTRY_FORMAT
from kcache.store import layout
from kcache.store.fsutil import ensure_dir, read_nofollow, sha256_hex, write_durable

log = logging.getLogger("kcache")


def compute_and_persist(root: Path, signature: str, libraries: list[str], compiler: str,
                        persist: bool = True) -> dict[str, object]:
    fingerprint = _compute([Path(p) for p in libraries], Path(compiler))
    if persist:
        _persist(Path(root) / layout.TOOLCHAIN / f"{signature}.json", fingerprint)
    return fingerprint


def _nvcc_version(compiler: Path) -> str:
    try:
        done = subprocess.run([str(compiler), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unavailable ({type(err).__name__}: {err})"
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    # "Cuda compilation tools, release 13.0, V13.0.88" and "Build cuda_13.0.r13.0/...".
    return " | ".join(lines[-2:]) if done.returncode == 0 and lines else f"unavailable (exit {done.returncode})"


def _compute(libraries: list[Path], compiler: Path) -> dict[str, object]:
    import tilelang

    return {
        "entry_format": ENTRY_FORMAT,
        "tilelang": tilelang.__version__,
        "tilelang_libs": {p.name: sha256_hex(read_nofollow(p)) for p in libraries},
        "nvcc": _nvcc_version(compiler),
        "machine": platform.machine(),
    }


def _persist(memo_file: Path, fingerprint: dict[str, object]) -> None:
    """Best effort: a read-only root just recomputes the fingerprint per process."""
    tmp = memo_file.with_name(f".{memo_file.name}.{uuid.uuid4().hex}")
    try:
        ensure_dir(memo_file.parent)
        write_durable(tmp, json.dumps(fingerprint, sort_keys=True).encode())
        os.replace(tmp, memo_file)
    except OSError as err:
        log.debug("kcache: could not persist the toolchain fingerprint at %s: %s", memo_file, err)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
