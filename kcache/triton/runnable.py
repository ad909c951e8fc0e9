"""A path Triton may `dlopen`: its launcher and driver modules are shared objects that it loads from
the path its cache manager returns. On a root mounted `noexec` the kernel refuses to map them there
(`failed to map segment from shared object`, and Triton builds them again, and again). Such a file
is handed over as a private copy on a filesystem that allows it (KCACHE_EXEC_DIR, the runtime
directory, the temporary directory, /dev/shm: kcache.store.exec_copy's candidates), in a directory
of this process's own (0700), removed when the process exits. Any other file is returned in place.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from kcache.errors import NoExecError
from kcache.store.exec_copy import exec_dir_candidates, noexec_mount

log = logging.getLogger("kcache")

_private: Path | None = None
_lock = threading.Lock()
_warned: set[Path] = set()


def runnable_path(path: Path) -> str:
    """`path`, or for a shared object on a noexec filesystem a private copy Triton may load."""
    if not path.name.endswith(".so"):
        return str(path)
    mount = noexec_mount(path.parent)
    if mount is None:
        return str(path)
    # One directory per entry: Triton gives every kernel's launcher the same file name.
    directory = _copy_directory(path, mount) / path.parent.name
    copy = directory / path.name
    with _lock:
        if not copy.exists():
            directory.mkdir(mode=0o700, exist_ok=True)
            partial = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
            shutil.copyfile(path, partial)
            os.chmod(partial, 0o500)
            os.replace(partial, copy)
    return str(copy)


def _copy_directory(path: Path, mount: Path) -> Path:
    global _private
    with _lock:
        if _private is None:
            for base in exec_dir_candidates():
                if noexec_mount(base) is None:
                    _private = Path(tempfile.mkdtemp(prefix="kcache-triton-exec-", dir=base))
                    atexit.register(shutil.rmtree, _private, True)
                    break
            else:
                raise NoExecError(str(path), str(mount), "no directory that allows exec to copy it to "
                                  "(set KCACHE_EXEC_DIR to one)")
        if mount not in _warned:
            _warned.add(mount)
            log.warning("kcache: %s is mounted noexec: Triton's shared objects from the cache there are loaded "
                        "from private copies in %s", mount, _private)
        return _private
