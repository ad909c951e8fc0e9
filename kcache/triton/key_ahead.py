"""Triton's key of its own installation, computed as the program imports Triton rather than in its
first compile (`kcache run`, `kcache.install()`).

Triton keys every compile, hit or miss, with `triton.runtime.cache.triton_key()`: a hash of its
compiler's, backends' and language's sources and of `libtriton.so` (415 MB in Triton 3.6: 0.2-0.4 s of
one core), computed once per process (`functools.lru_cache`) in the process's first compile, before
any cache manager is asked. kcache calls that same function in a thread of its own once the program's
`import triton` has run: a program that does anything between importing Triton and its first kernel
(building a model, starting CUDA) finds it done, and its tunes fan out that much sooner
(stress.bench.triton_tunes). The value is Triton's own: its function, its memo.

The thread imports nothing: it starts only where every package Triton's walk would import is loaded
already (checked, not assumed: after `import triton` they are, in Triton 3.6 and 3.8), so that a fork of
the program while it hashes inherits no import lock of it; the fork's first compile computes the key as
it would have. A first compile that comes before the thread ends computes the key too, as it would have:
Triton's memo holds a value only once one is computed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from kcache.import_hooks import after_import

log = logging.getLogger("kcache")

THREAD_NAME = "kcache-triton-key"
WALKED = ("compiler", "backends", "language")  # the folders triton_key walks with pkgutil.walk_packages
_state = {"started": False}
_lock = threading.Lock()


def when_triton_imported() -> None:
    """Start the key's computation once the program's `import triton` has run (now, if it has)."""
    after_import("triton", _start_quietly)


def _start_quietly() -> None:
    """`start`, from the program's `import triton`: whatever goes wrong here must not fail that import."""
    try:
        start()
    except Exception as err:  # noqa: BLE001 - the first compile computes the key, as without kcache
        log.debug("kcache: Triton's key left to its first compile: %s: %s", type(err).__name__, err)


def start() -> threading.Thread | None:
    """The thread computing Triton's key, started; None where there is nothing to do or it would import."""
    with _lock:
        if _state["started"]:
            return None
        _state["started"] = True
    cache = sys.modules.get("triton.runtime.cache")
    key = getattr(cache, "triton_key", None)
    if cache is None or not hasattr(key, "cache_info"):  # another Triton: leave its key to its first compile
        return None
    if key.cache_info().currsize:  # computed already
        return None
    missing = unloaded_packages(os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__))))
    if missing:
        log.debug("kcache: Triton's key left to its first compile: computing it now would import %s", missing[0])
        return None
    thread = threading.Thread(target=_compute, args=(key,), name=THREAD_NAME, daemon=True)
    thread.start()
    return thread


def unloaded_packages(triton_dir: str) -> list[str]:
    """The packages under `triton_dir`'s walked folders (a folder with an `__init__.py`, as pkgutil finds
    packages) that are not loaded, and `pkgutil` if it is not: what triton_key would import."""
    missing = [] if "pkgutil" in sys.modules else ["pkgutil"]
    for folder in WALKED:
        top = os.path.join(triton_dir, folder)
        for path, subfolders, files in os.walk(top):
            subfolders[:] = [name for name in subfolders if name != "__pycache__"]
            if "__init__.py" not in files:
                continue
            name = ".".join(["triton", *os.path.relpath(path, triton_dir).split(os.sep)])
            if name not in sys.modules:
                missing.append(name)
    return missing


def _compute(key: Any) -> None:
    try:
        key()
    except Exception as err:  # noqa: BLE001 - the first compile computes it, and meets the error
        log.debug("kcache: computing Triton's key ahead failed (%s: %s); its first compile computes it",
                  type(err).__name__, err)
