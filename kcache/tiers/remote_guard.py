"""What every remote tier (Redis, S3) shares: refused values, signatures bound to their key, and a
circuit breaker that keeps an unreachable or slow store off the caller's path.

A remote store is input from whoever can write to it, and it may be down: a value that does not
verify is a miss with one warning, and a store that fails or overruns its deadline is left alone for
`retry_after_s` (one warning when it goes, one when it is back) while kcache works locally.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kcache")

_LEN = struct.Struct(">I")
DIGEST_SIZE = 32
# A lease is a hundred-odd bytes: a value far bigger is not one of ours. It is measured before it is
# read, never downloaded, and taken over as any invalid lease is.
MAX_LEASE_BYTES = 4 << 10
# Slack for the clocks of different nodes when a lease's expiry (wall-clock time) is judged.
LEASE_SKEW_S = 10.0


_refusals_said: set[tuple[str, str, str]] = set()


def warn_refused(url: str, name: str, reason: object) -> None:
    """One warning per remote entry, tier and reason in a process: a claim looks at the tier again once
    it holds the lease (another node may have uploaded meanwhile), and finds the same refused value."""
    said = (url, name, str(reason))
    if said in _refusals_said:
        log.debug("kcache: ignoring remote entry %s in %s again: %s", name, url, reason)
        return
    _refusals_said.add(said)
    log.warning("kcache: ignoring remote entry %s in %s: %s; it is recompiled and replaced", name, url, reason)


class RemoteCorrupt(ValueError):
    """A remote value that is not a whole, authentic entry."""


def bound_mac(secret: bytes, bound_to: str, body: bytes) -> bytes:
    """The HMAC-SHA256 of `body` bound to the name it is stored under (a Redis key, an object name): a
    signed value copied under another name, or into another toolchain's namespace, does not verify
    there."""
    label = bound_to.encode()
    return hmac.new(secret, _LEN.pack(len(label)) + label + body, hashlib.sha256).digest()


class CircuitBreaker:
    """Runs one remote operation within a deadline; a failure or an overrun opens the breaker (the store
    is "down") for `retry_after_s`, during which operations return their `failed` value at once.

    The operation runs on a thread of its own so that the deadline holds whatever its socket does;
    one that overruns is left to finish or fail there. Only `Exception`s are the store's: a
    KeyboardInterrupt raised inside is re-raised in the caller."""

    def __init__(self, url: str, operation_timeout_s: float, retry_after_s: float) -> None:
        self.url = url
        self.operation_timeout_s = operation_timeout_s
        self.retry_after_s = retry_after_s
        self._down_until = 0.0
        self._warned = False
        self._guard = threading.Lock()

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def call(self, operation: Callable[[], Any], failed: Any = None) -> Any:
        if not self.available():
            return failed
        outcome: dict[str, Any] = {}
        finished = threading.Event()

        def run() -> None:
            try:
                outcome["value"] = operation()
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread below
                outcome["error"] = err
            finally:
                finished.set()

        threading.Thread(target=run, name="kcache-remote", daemon=True).start()
        if not finished.wait(self.operation_timeout_s):
            self.mark_down(TimeoutError(f"no whole answer within {self.operation_timeout_s:g} s"))
            return failed
        error = outcome.get("error")
        if error is not None:
            if not isinstance(error, Exception):
                raise error
            self.mark_down(error)
            return failed
        if self._warned:
            with self._guard:
                self._warned = False
                log.warning("kcache: the remote cache %s is back", self.url)
        return outcome["value"]

    def mark_down(self, err: BaseException) -> None:
        with self._guard:
            self._down_until = time.monotonic() + self.retry_after_s
            if not self._warned:
                self._warned = True
                log.warning("kcache: the remote cache %s is unavailable (%s: %s); working locally, retrying in "
                            "%.0f s", self.url, type(err).__name__, err, self.retry_after_s)
