"""Where this user's compile service for this environment listens, and what makes two environments one.

One service per (user, machine, Python environment and toolchain): the socket's name holds a digest
of the interpreter, kcache's own location and message format, the worker preload, the worker count and the import-time
settings of TileLang (the toolkit and header directories). Not sys.path: each job carries its
client's (`kcache.compile.worker.run_client_job`), so programs in different directories share one
service, and `kcache server start` names the same one. A process of another environment
computes another name and starts its own service; it never talks to this one.

The socket lives in a directory only this user can enter: `$XDG_RUNTIME_DIR/kcache` where that is
ours and private, else `<tmp>/kcache-<uid>`, created 0700 and checked (a real directory, ours, no
access for others) every time. A predictable name in a shared tmp is safe here only because of that
check: another user who made it first fails it, and then there is no service (the per-process pool
compiles), never a connection to their socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kcache.compile.protocol import SERVICE_PROTOCOL
from kcache.store import access

# Import-time settings of TileLang that a compile depends on: a service started with other values
# would compile something else (docs/design.md, "The compile context").
IMPORT_TIME_ENV = ("CUDA_HOME", "CUDA_PATH", "PATH", "TL_TEMPLATE_PATH", "TL_CUTLASS_PATH", "TVM_LIBRARY_PATH",
                   "KCACHE_UMASK", "KCACHE_GROUP")


def tilelang_default_paths() -> dict[str, str]:
    """What `import tilelang` sets TL_TEMPLATE_PATH, TL_CUTLASS_PATH and TVM_LIBRARY_PATH to where they
    are unset (tilelang/env.py, 0.1.15), found without importing it.

    A process that imported TileLang before its cache opened has them set; one that opens the cache
    first has not. Both mean the same environment, so a value equal to TileLang's own default names
    the service as an unset one does: otherwise the two orders start two services (measured: a herd
    that imports TileLang first never used the service warmed up before it). Where this misreads a
    layout, the cost is a second service, never a wrong compile: the values are then compared as set."""
    spec = importlib.util.find_spec("tilelang")
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


class NoServiceDirectory(OSError):
    """No private directory for the service's socket: the directory another user made, say."""


def identity(preload: Iterable[str], workers: int) -> str:
    """The digest naming this environment's service."""
    document = {
        "python": sys.executable,
        "version": sys.version,
        "kcache": str(Path(__file__).resolve().parents[1]),
        "protocol": SERVICE_PROTOCOL,
        "preload": list(preload),
        "workers": workers,
        "env": {name: os.environ.get(name) for name in IMPORT_TIME_ENV},
    }
    for name, default in tilelang_default_paths().items():
        if document["env"][name] == default:
            document["env"][name] = None
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:20]


def service_directory() -> Path:
    """This user's private directory for service sockets (created if missing). Raises
    NoServiceDirectory when there is none that is ours alone."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and access.is_private_and_ours(Path(runtime)):
        candidate = Path(runtime) / "kcache"
    else:
        candidate = Path(tempfile.gettempdir()) / f"kcache-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(candidate, 0o700)
    if not access.is_private_and_ours(candidate):
        raise NoServiceDirectory(f"{candidate} is not a private directory of uid {os.geteuid()} (a link, another "
                                 "user's, or open to others): no compile service; remove it or set XDG_RUNTIME_DIR")
    return candidate


# sockaddr_un's sun_path: 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


def socket_path(name: str) -> Path:
    path = service_directory() / f"compile-{name}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise NoServiceDirectory(f"{path} is longer than a Unix socket's path may be ({MAX_SOCKET_PATH} bytes): "
                                 "set XDG_RUNTIME_DIR to a shorter private directory")
    return path


def lock_path(name: str) -> Path:
    return service_directory() / f"compile-{name}.lock"


def start_lock_path(name: str) -> Path:
    """Held by the one client that starts the service `name` (`service_client.connect_or_start`)."""
    return service_directory() / f"compile-{name}.start.lock"


def log_path(name: str) -> Path:
    return service_directory() / f"compile-{name}.log"
