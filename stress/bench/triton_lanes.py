"""The two lanes of the bench's Triton rows: a child's environment with Triton's own cache manager, and
what kcache's lane adds to it."""

from __future__ import annotations

from ..procs import worker_env

KCACHE = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}


def plain_env(env: dict[str, str]) -> dict[str, str]:
    """A child's environment (worker_env) with Triton's own cache manager: each lane adds kcache's."""
    return {key: value for key, value in worker_env(env).items() if key != "TRITON_CACHE_MANAGER"}
