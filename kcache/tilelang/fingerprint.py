"""The toolchain part of every key, on the hit path: a stat signature and the memo it names.

A memo miss loads `kcache.tilelang.toolchain`, which hashes the libraries and asks nvcc its version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kcache.keys import ENTRY_FORMAT, derive_key
from kcache.store import layout, trust

_LIB_NAMES = ("libtilelang.so", "libtvm_compiler.so", "libtvm_runtime.so")
_toolchain_memo: dict[str, dict[str, object]] = {}


def toolchain_signature() -> tuple[str, list[str], str]:
    """(signature, libraries, compiler): a stat signature of every file the fingerprint is computed from.

    A library that does not exist is left out; nvcc and the toolkit's cuda.h
    are stat'ed through any symlink (os.stat follows it), so retargeting a
    link changes the signature through the target's inode, size and mtime.
    """
    import importlib

    from tilelang.contrib import nvcc

    tl_env = importlib.import_module("tilelang.env")  # the module: `from tilelang import env` is an object

    libraries: list[str] = []
    rows: list[list[object]] = []
    for lib_dir in getattr(tl_env, "TL_LIBS", []):
        for name in _LIB_NAMES:
            path = os.path.join(lib_dir, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            libraries.append(path)
            rows.append([path, st.st_size, st.st_mtime_ns, st.st_ino])
    compiler = nvcc.get_nvcc_compiler()
    cuda_h = os.path.join(nvcc.find_cuda_path(), "include", "cuda.h")
    for path in (compiler, cuda_h):
        try:
            st = os.stat(path)
            rows.append([path, st.st_size, st.st_mtime_ns, st.st_ino])
        except FileNotFoundError:
            rows.append([path, None])
    return derive_key({"files": rows, "entry_format": ENTRY_FORMAT}), libraries, compiler


def toolchain_fingerprint(root: Path, persist: bool = True) -> dict[str, object]:
    """The toolchain part of every key: memoized per process and under `<root>/.toolchain/`.

    Only a memo miss loads `kcache.tilelang.toolchain` (which hashes ~100 MB of
    libraries and runs nvcc --version), and only one process of the root hashes at a time.
    """
    signature, libraries, compiler = toolchain_signature()
    cached = _toolchain_memo.get(signature)
    if cached is not None:
        return cached
    fingerprint = read_memo(Path(root), signature)
    if fingerprint is None:
        from kcache.tilelang import toolchain  # a memo miss only: it hashes ~100 MB

        if persist:
            fingerprint = toolchain.identify_once(Path(root), signature, libraries, compiler, read_memo)
        else:
            fingerprint = toolchain.compute_and_persist(root, signature, libraries, compiler, persist=False)
    _toolchain_memo[signature] = fingerprint
    return fingerprint


def read_memo(root: Path, signature: str) -> dict[str, object] | None:
    """The fingerprint persisted for `signature` under `root`, or None when it is missing or unusable."""
    try:
        # Trust-checked like an entry: a planted memo would name another toolchain in every key.
        found = json.loads(trust.read_trusted(root, Path(layout.TOOLCHAIN), signature + ".json", 1 << 20))
    except (OSError, ValueError):  # missing, untrusted (UntrustedEntry is an OSError), or damaged: recompute
        return None
    return found if isinstance(found, dict) else None
