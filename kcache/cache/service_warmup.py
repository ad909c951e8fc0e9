"""The compile service's warm-up, in server mode: reach (or start) this user's compile service in the
background, ask it for warm workers, and have one of them identify the toolchain, so that a cold
machine's first compile overlaps what the program does next instead of following it.

kcache.cache.kernel_cache loads it only to warm the service up, which loads the service's client:
a process that opens a cache and only hits (after importing TileLang) never imports it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from kcache.config import Settings


def warm_in_background(settings: Settings, count: int, identify_in: str | None) -> None:
    """Reach the compile service of `settings` and warm `count` workers, in a thread of its own; then
    (when `identify_in` is a root) the toolchain fingerprint of that root. Never blocks, never raises."""
    from kcache.compile.fork.caller_fork import SERVICE_WARM_THREAD
    from kcache.compile.pool.process_pool import (
        TILELANG_PRELOAD,  # the TileLang backend's preload, without importing it
    )
    from kcache.compile.service.shared_pools import shared_service_pool

    service = shared_service_pool(settings.compile_workers, settings.compile_timeout_s, TILELANG_PRELOAD,
                                  settings.server_idle_s)
    threading.Thread(target=warm_service, args=(service, count, identify_in), name=SERVICE_WARM_THREAD,
                     daemon=True).start()


def warm_service(service: Any, count: int, identify_in: str | None) -> None:
    """The warm-up's thread: `count` workers, then the toolchain fingerprint of the root `identify_in`
    computed by a worker of the service, which imports TileLang anyway. The program's first lookup then
    reads the root's memo instead of hashing TileLang's 105 MB of libraries itself (a cache opened
    before `import tilelang` identifies the toolchain at its first lookup), and a herd of processes
    that opened one fresh root hashes once, before its barrier, instead of once each after it."""
    service.warm(count)
    if identify_in is None:
        return
    from kcache.compile.jobs import JobOutput
    from kcache.compile.protocol import CallByName

    # One job per root in flight, whichever processes ask: a herd of 32 that opened one fresh root
    # at once would otherwise have the service fork 16 workers for 32 identical jobs, just as
    # its first compile arrives.
    job = service.submit_to_service(CallByName("kcache.tilelang.fingerprint", "toolchain_fingerprint"), identify_in,
                                    name="identifying the toolchain",
                                    output=JobOutput(f"toolchain of {os.path.realpath(identify_in)}", None))
    if job is not None:
        # The thread lives as long as its job (a disconnect would stop it). A failure here costs
        # nothing: the first lookup identifies the toolchain itself and meets the failure there.
        with contextlib.suppress(Exception):
            job.result()
