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
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import platform
import subprocess
import uuid
from pathlib import Path

from . import layout
from .fsutil import ensure_dir, read_nofollow, sha256_hex, write_durable
from .keys import ENTRY_FORMAT, derive_key

log = logging.getLogger("kcache")

_LIB_NAMES = ("libtilelang.so", "libtvm_compiler.so", "libtvm_runtime.so")
_memo: dict[str, dict[str, object]] = {}


def _tilelang_libraries() -> list[Path]:
    env_module = importlib.import_module("tilelang.env")
    found = []
    for lib_dir in getattr(env_module, "TL_LIBS", []):
        for name in _LIB_NAMES:
            path = Path(lib_dir) / name
            if path.exists():
                found.append(path)
    return found


def _nvcc_inputs() -> tuple[Path, list[Path]]:
    from tilelang.contrib import nvcc

    compiler = Path(nvcc.get_nvcc_compiler())
    watched = [compiler, Path(os.path.realpath(compiler))]
    cuda_home = Path(nvcc.find_cuda_path())
    # nvcc is often a wrapper script; the toolkit's headers change with it.
    watched.append(Path(os.path.realpath(cuda_home / "include" / "cuda.h")))
    return compiler, watched


def _stat_signature(paths: list[Path]) -> list[list[object]]:
    rows: list[list[object]] = []
    for path in paths:
        try:
            st = os.stat(path)
            rows.append([str(path), st.st_size, st.st_mtime_ns, st.st_ino])
        except FileNotFoundError:
            rows.append([str(path), None])
    return rows


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


def toolchain_fingerprint(root: Path) -> dict[str, object]:
    libraries = _tilelang_libraries()
    compiler, watched = _nvcc_inputs()
    signature = derive_key({"files": _stat_signature(libraries + watched), "entry_format": ENTRY_FORMAT})
    cached = _memo.get(signature)
    if cached is not None:
        return cached
    memo_file = root / layout.TOOLCHAIN / f"{signature}.json"
    try:
        fingerprint = json.loads(read_nofollow(memo_file))
    except (OSError, ValueError):
        fingerprint = _compute(libraries, compiler)
        _persist(memo_file, fingerprint)
    _memo[signature] = fingerprint
    return fingerprint


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
