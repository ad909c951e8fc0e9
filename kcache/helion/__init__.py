"""Helion's autotune picks on kcache's store: `HELION_REMOTE_CACHE_BACKEND=kcache.helion.Backend` with
`HELION_AUTOTUNE_CACHE=RemoteAutotuneCache` (docs/operations.md, "Helion").

Importing this package imports nothing of Helion's (`kcache.helion.backend` subclasses its
RemoteCacheBackend): `ENV`, `ENV_VALUE` and `enable()` do not.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

BACKEND_ENV = "HELION_REMOTE_CACHE_BACKEND"
CACHE_ENV = "HELION_AUTOTUNE_CACHE"
ENV_VALUE = "kcache.helion.Backend"
CACHE_VALUE = "RemoteAutotuneCache"
_set_here: set[str] = set()  # what enable() set in os.environ, for disable()


def enable(environ: MutableMapping[str, str] | None = None) -> bool:
    """Name kcache's backend to Helion in `environ` (os.environ: this process and its children), unless
    the user named a backend or a cache class of their own; whether kcache's is the one in force."""
    if environ is None:
        environ = os.environ
    backend, cache = environ.get(BACKEND_ENV), environ.get(CACHE_ENV)
    if (backend and backend != ENV_VALUE) or (cache and "Remote" not in cache):
        return False
    environ[BACKEND_ENV] = ENV_VALUE
    if not cache:
        environ[CACHE_ENV] = CACHE_VALUE
        if environ is os.environ:
            _set_here.add(CACHE_ENV)
    return True


def disable(environ: MutableMapping[str, str] | None = None) -> None:
    """Undo `enable` where it named kcache's backend."""
    if environ is None:
        environ = os.environ
    if environ.get(BACKEND_ENV) == ENV_VALUE:
        del environ[BACKEND_ENV]
        if environ is os.environ and CACHE_ENV in _set_here:  # a cache class the user named stays
            _set_here.discard(CACHE_ENV)
            environ.pop(CACHE_ENV, None)


def __getattr__(name: str) -> object:
    if name == "Backend":  # Helion resolves "kcache.helion.Backend" through this
        from kcache.helion.backend import Backend

        return Backend
    raise AttributeError(name)
