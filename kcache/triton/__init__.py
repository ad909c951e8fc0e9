"""Triton's kernels (and so Inductor's) on kcache's store: `TRITON_CACHE_MANAGER=kcache.triton:CacheManager`.

A Triton compile group becomes one kcache entry under `<root>/triton/`, published whole with one
rename and verified on every load; N processes that miss one key compile it once; a foreign-owned or
read-only root serves its hits and saves new groups in the per-user fallback; a noexec root's shared
objects load from private copies (docs/operations.md, "Triton and Inductor").

Importing this package imports Triton (`kcache.triton.manager` subclasses its CacheManager):
`kcache.triton.ENV_VALUE` and `enable()` do not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENV = "TRITON_CACHE_MANAGER"
# What a user names by hand (a Python that can import kcache), and what kcache sets: the same class,
# through a module that falls back to Triton's own manager in a Python without kcache (child_path/).
MODULE_VALUE = "kcache.triton:CacheManager"
ENV_VALUE = "kcache_triton_manager:CacheManager"
ENV_VALUES = frozenset({MODULE_VALUE, ENV_VALUE})
CHILD_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_path")


def enable(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set TRITON_CACHE_MANAGER to kcache's in `environ` (os.environ: this process and its children,
    CHILD_PATH then on PYTHONPATH and on this process's sys.path), unless it names a manager already;
    whether kcache's is the one in force."""
    if environ is None:
        environ = os.environ
    chosen = environ.get(ENV)
    if chosen:
        return chosen in ENV_VALUES
    environ[ENV] = ENV_VALUE
    entries = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if CHILD_PATH not in entries:
        environ["PYTHONPATH"] = os.pathsep.join([*entries, CHILD_PATH])
    if environ is os.environ and CHILD_PATH not in sys.path:
        sys.path.append(CHILD_PATH)
    return True


def disable(environ: MutableMapping[str, str] | None = None) -> None:
    """Undo `enable` where it set kcache's manager."""
    if environ is None:
        environ = os.environ
    if environ.get(ENV) == ENV_VALUE:
        del environ[ENV]
        entries = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != CHILD_PATH]
        if entries:
            environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            environ.pop("PYTHONPATH", None)


def __getattr__(name: str) -> object:
    if name == "CacheManager":  # Triton resolves "kcache.triton:CacheManager" through this
        from kcache.triton.manager import CacheManager

        return CacheManager
    raise AttributeError(name)
