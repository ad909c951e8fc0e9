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
from collections.abc import MutableMapping

ENV = "TRITON_CACHE_MANAGER"
ENV_VALUE = "kcache.triton:CacheManager"


def enable(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set TRITON_CACHE_MANAGER to kcache's in `environ` (os.environ: this process and its children),
    unless it names a manager of the user's own; whether kcache's is the one set."""
    if environ is None:
        environ = os.environ
    chosen = environ.get(ENV)
    if chosen and chosen != ENV_VALUE:
        return False
    environ[ENV] = ENV_VALUE
    return True


def __getattr__(name: str) -> object:
    if name == "CacheManager":  # Triton resolves "kcache.triton:CacheManager" through this
        from kcache.triton.manager import CacheManager

        return CacheManager
    raise AttributeError(name)
