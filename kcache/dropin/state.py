"""What the drop-in holds while installed: TileLang's originals and the cache kcache serves from."""

from __future__ import annotations

import threading
from typing import Any

from kcache.cache.default import default_cache
from kcache.cache.kernel_cache import KernelCache
from kcache.setting_values import DROPIN_ENV

ENV = DROPIN_ENV

lock = threading.Lock()
# TileLang's originals while installed ("cached", "save", "load", "run"), and the chosen "cache"; None when not.
installed: dict[str, Any] | None = None
# Where install() left TileLang alone (not installed, or unsupported: kcache/tilelang/support.py) but routed Triton and
# Helion: which of the two it chose for them ("triton_was_unset", "helion_was_unset"), for uninstall().
passed_through: dict[str, bool] | None = None


def cache() -> KernelCache:
    """The cache the drop-in serves from: the one given to install(), else kcache's default cache."""
    current = installed
    chosen = current.get("cache") if current is not None else None
    return chosen if chosen is not None else default_cache()
