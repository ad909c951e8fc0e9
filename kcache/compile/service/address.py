"""Where this user's compile service for this environment listens, and what makes two environments one.

One service per (user, machine, Python environment and toolchain): the socket's name holds a digest
of the interpreter (what it is, not how it was spelled), kcache's own location and message format,
the worker preload, the worker count, the import-time settings of TileLang (the toolkit and header
directories) and the programs PATH finds for a compile. Not sys.path: each
job carries its client's (`kcache.compile.workers.worker.run_client_job`), so programs in different
directories share one service, and `kcache server start` names the same one. A process of another
environment computes another name and starts its own service; it never talks to this one.

The socket lives in a directory only this user can enter (`kcache.compile.runtime_dir`): another
user who made it first fails that directory's check, and then there is no service (the per-process
pool compiles), never a connection to their socket.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import socket
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

from kcache.compile.protocol import SERVICE_PROTOCOL
from kcache.compile.runtime_dir import NoServiceDirectory, runtime_directory

# Start-time settings that a compile depends on: a service started with other values would compile
# something else (docs/design/key.md, "The compile context"). TileLang's import-time paths; and the hash
# seed, which every worker inherits from the service's start: TileLang's lowering iterates over
# hashed sets, so its output can differ with the seed (a LayerNorm of tests/corpus did).
IMPORT_TIME_ENV = ("CUDA_HOME", "CUDA_PATH", "TL_TEMPLATE_PATH", "TL_CUTLASS_PATH", "TVM_LIBRARY_PATH",
                   "KCACHE_UMASK", "KCACHE_GROUP", "PYTHONHASHSEED")
# What the service's workers find on PATH, rather than PATH's spelling: TileLang finds its CUDA by
# `nvcc` on PATH when CUDA_HOME is unset, and nvcc and TileLang's host build run the C and C++
# compilers PATH finds (ccache among them, if it is there). pyenv's shims, a venv's activation or a
# module system prepend directories that find the same programs: one service for all of them.
PATH_TOOLS = ("nvcc", "cc", "c++", "gcc", "g++", "ccache")


def tilelang_default_paths() -> dict[str, str]:
    """What `import tilelang` sets TL_TEMPLATE_PATH, TL_CUTLASS_PATH and TVM_LIBRARY_PATH to where they
    are unset (tilelang/env.py, 0.1.15), found without importing it.

    A process that imported TileLang before its cache opened has them set; one that opens the cache
    first has not. Both mean the same environment, so a value equal to TileLang's own default names
    the service as an unset one does: otherwise the two orders start two services (measured: a herd
    that imports TileLang first never used the service warmed up before it). Where this misreads a
    layout, the cost is a second service, never a wrong compile: the values are then compared as set.
    Looked up on sys.path by the path finder alone, not through sys.meta_path: an import hook there
    (kcache's own, under `kcache run`, opens TileLang's cache when `tilelang` is looked up) would take
    this look-up for TileLang's import, from a process that compiles only Triton."""
    module = sys.modules.get("tilelang")
    spec = module.__spec__ if module is not None else importlib.machinery.PathFinder.find_spec("tilelang")
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = os.path.abspath(next(iter(spec.submodule_search_locations)))
    third_party = os.path.join(root, "3rdparty")
    if os.path.exists(third_party):
        libs = [lib for lib in [os.path.join(root, "lib")] if os.path.exists(lib)]
    else:  # TileLang's development layout: the build tree beside the package
        build = os.path.join(os.path.dirname(root), "build")
        libs = [os.path.join(build, "lib"), os.path.join(build, "tvm")]
        third_party = os.path.join(os.path.dirname(root), "3rdparty")
    return {"TVM_LIBRARY_PATH": os.pathsep.join(libs),
            "TL_CUTLASS_PATH": os.path.join(third_party, "cutlass", "include"),
            "TL_TEMPLATE_PATH": os.path.join(third_party, "..", "src")}


def path_tools() -> dict[str, str | None]:
    """Where each of PATH_TOOLS is found on PATH, links resolved (None: not found)."""
    found = {tool: shutil.which(tool) for tool in PATH_TOOLS}
    return {tool: None if where is None else os.path.realpath(where) for tool, where in found.items()}


def identity(preload: Iterable[str], workers: int) -> str:
    """The digest naming this environment's service: the interpreter by what it is (its real file and
    its environment's prefix, not the name it was started by: `python`, `python3.11` and the `kcache`
    console script of one venv are one environment), and what the worker's compile depends on."""
    document = {
        "python": os.path.realpath(sys.executable),
        "prefix": sys.prefix,  # a venv's own: two venvs of one interpreter have other packages
        "version": sys.version,
        "path_tools": path_tools(),
        "kcache": str(Path(__file__).resolve().parents[2]),
        "protocol": SERVICE_PROTOCOL,
        "preload": list(preload),
        "workers": workers,
        "env": {name: os.environ.get(name) for name in IMPORT_TIME_ENV},
    }
    for name, default in tilelang_default_paths().items():
        if document["env"][name] == default:
            document["env"][name] = None
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:20]


# sockaddr_un's sun_path: 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


def socket_path(name: str) -> Path:
    path = runtime_directory() / f"compile-{name}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise NoServiceDirectory(f"{path} is longer than a Unix socket's path may be ({MAX_SOCKET_PATH} bytes): "
                                 "set XDG_RUNTIME_DIR to a shorter private directory")
    return path


def lock_path(name: str) -> Path:
    return runtime_directory() / f"compile-{name}.lock"


def start_lock_path(name: str) -> Path:
    """Held by the one client that starts the service `name` (`connection.connect_or_start`)."""
    return runtime_directory() / f"compile-{name}.start.lock"


def log_path(name: str) -> Path:
    return runtime_directory() / f"compile-{name}.log"


PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED): the server checks its
    clients', and a client its server's."""
    _pid, uid, _gid = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return uid
